#!/usr/bin/env bash
# A real Home Assistant for tests/integration/test_homeassistant.py, in its own venv
# (.cache/ha-venv by default, or $1). Never a run-time dependency of edge-inferd: the daemon
# only publishes MQTT discovery messages; this is what reads them in the test.
#   ./scripts/setup_ha.sh [VENV]
# 2024.3.3 is the newest release that installs on Python 3.11 (2024.4 needs 3.12). Besides the
# core, only what the test's components need is installed: mqtt's paho-mqtt pin, and http's
# and the frontend-less api's requirements (HA installs missing ones itself at start-up, which
# the test forbids with --skip-pip so that it never reaches the network).
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
HA_VERSION="2024.3.3"
VENV="${1:-.cache/ha-venv}"
PY="$VENV/bin/python"

if [ -x "$PY" ] && "$PY" -c "import homeassistant.const as c, paho.mqtt, aiohttp_cors; assert c.__version__ == '$HA_VERSION'" 2>/dev/null; then
    exit 0
fi
echo "setup_ha: installing homeassistant==$HA_VERSION into $VENV" >&2
python3 -m venv "$VENV"
"$PY" -m pip install -q --upgrade pip
# The core with HA's own pins (package_constraints.txt ships inside the wheel, read after install).
"$PY" -m pip install -q "homeassistant==$HA_VERSION"
CONSTRAINTS="$("$PY" -c 'import homeassistant, os; print(os.path.join(os.path.dirname(homeassistant.__file__), "package_constraints.txt"))')"
# Component requirements (their manifest.json "requirements"): mqtt, http (+ its deps).
REQS="$("$PY" - <<'PY'
import json, pathlib, homeassistant.components as comps
root = pathlib.Path(comps.__path__[0])
want = ["mqtt", "http", "api", "auth", "onboarding", "file_upload", "repairs", "websocket_api", "person", "network"]
reqs = set()
for name in want:
    manifest = root / name / "manifest.json"
    if manifest.exists():
        reqs.update(json.loads(manifest.read_text()).get("requirements", []))
print(" ".join(sorted(reqs)))
PY
)"
if [ -n "$REQS" ]; then
    # shellcheck disable=SC2086
    "$PY" -m pip install -q -c "$CONSTRAINTS" $REQS
fi
"$PY" -c "import homeassistant.const as c; print('setup_ha: Home Assistant', c.__version__, 'ready in $VENV')"
