#!/usr/bin/env bash
# A real Home Assistant for tests/integration/test_homeassistant.py, in its own venv
# (.cache/ha-venv by default, or $1). Never a run-time dependency of edge-inferd: the daemon
# only publishes MQTT discovery messages; this is what reads them in the test.
#   ./scripts/setup_ha.sh [VENV]
# 2024.3.3 is the newest release that installs on Python 3.11 (2024.4 needs 3.12). Besides the
# core, what the integrations it sets up need is installed here (HA would install missing ones
# itself at start-up, which the test forbids with --skip-pip so that it never reaches the network).
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
HA_VERSION="2024.3.3"
VENV="${1:-.cache/ha-venv}"
PY="$VENV/bin/python"

READY="$VENV/edge-inferd-ha-ready"  # written last: the tests run HA only from a finished venv
if [ -f "$READY" ] && "$PY" -c "import homeassistant.const as c, paho.mqtt, aiohttp_cors, hass_frontend, PIL, sqlalchemy, numpy; assert c.__version__ == '$HA_VERSION'" 2>/dev/null; then
    exit 0
fi
echo "setup_ha: installing homeassistant==$HA_VERSION into $VENV" >&2
rm -f "$READY"
python3 -m venv "$VENV"
"$PY" -m pip install -q --upgrade pip
# The core with HA's own pins (package_constraints.txt ships inside the wheel, read after install).
"$PY" -m pip install -q "homeassistant==$HA_VERSION"
CONSTRAINTS="$("$PY" -c 'import homeassistant, os; print(os.path.join(os.path.dirname(homeassistant.__file__), "package_constraints.txt"))')"
# Component requirements (their manifest.json "requirements"), for the integrations HA sets up
# whatever the config says (bootstrap's DEFAULT_INTEGRATIONS: frontend, person, backup, ... -- a
# failed one sends HA into recovery mode) plus the test's mqtt, http, api and auth, with the
# dependencies and after_dependencies of each, transitively.
REQS="$("$PY" - <<'PY'
import json, pathlib
from homeassistant import bootstrap
import homeassistant.components as comps
root = pathlib.Path(comps.__path__[0])
todo = set(bootstrap.DEFAULT_INTEGRATIONS) | set(bootstrap.CORE_INTEGRATIONS) | {"mqtt", "http", "api", "auth"}
seen, reqs = set(), set()
while todo:
    name = todo.pop()
    seen.add(name)
    manifest = root / name / "manifest.json"
    if manifest.exists():
        data = json.loads(manifest.read_text())
        reqs.update(data.get("requirements", []))
        todo.update(set(data.get("dependencies", []) + data.get("after_dependencies", [])) - seen)
print(" ".join(sorted(reqs)))
PY
)"
# josepy 2 removed what acme (under hass-nabucasa, cloud's library) still imports; camera, which
# cloud's alexa imports, imports stream, which imports numpy at the top.
# shellcheck disable=SC2086
"$PY" -m pip install -q -c "$CONSTRAINTS" $REQS 'josepy<2' numpy
"$PY" -c "import homeassistant.const as c; print(c.__version__)" > "$READY"
echo "setup_ha: Home Assistant $(cat "$READY") ready in $VENV" >&2
