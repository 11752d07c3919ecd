#!/usr/bin/env bash
# The whole test suite, from nothing: ./scripts/test.sh [pytest args]
# Installs what it needs itself: .venv (runtime + pytest), mosquitto, and .venv-tflite
# (tflite-runtime with numpy<2) for the backend parity tests, and the real third-party models
# the tests run (scripts/fetch_test_models.sh: once, into .cache/test-models; checked after), and
# Home Assistant in .cache/ha-venv (scripts/setup_ha.sh) for the discovery tests, and MLServer and
# KServe in .cache/v2-venvs (scripts/setup_v2.sh) for the v2 far-tier tests.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh

if .venv/bin/python -c 'import tflite_runtime.interpreter' 2>/dev/null \
        && ! .venv/bin/python -c 'import ai_edge_litert.interpreter' 2>/dev/null; then
    # armv7: .venv runs tflite-runtime itself (scripts/setup.sh), and there is no litert to
    # compare it with: the parity tests skip.
    export EDGE_INFERD_TFLITE_PYTHON="$PWD/.venv/bin/python"
else
    if ! .venv-tflite/bin/python -c 'import tflite_runtime.interpreter, yaml, diskcache, paho.mqtt, orjson, PIL' 2>/dev/null; then
        echo "test: creating .venv-tflite (tflite-runtime 2.14 needs numpy<2 and Python <= 3.11)" >&2
        python3 -m venv .venv-tflite
        .venv-tflite/bin/pip install -q 'tflite-runtime==2.14.*' 'numpy<2' pyyaml diskcache 'paho-mqtt>=2.2,<3' 'orjson>=3.9' 'pillow>=10'
    fi
    export EDGE_INFERD_TFLITE_PYTHON="$PWD/.venv-tflite/bin/python"
fi

# A real Home Assistant for tests/integration/test_homeassistant.py (its own venv, ~2 min once;
# never a dependency of the daemon). Optional: where it cannot be installed those tests skip.
if [ -n "${EDGE_INFERD_SKIP_HA:-}" ]; then  # e.g. check-arm.sh's unit run: HA is for integration tests
    echo "test: EDGE_INFERD_SKIP_HA is set: Home Assistant is not installed, its tests skip" >&2
else
    ./scripts/setup_ha.sh || echo "test: Home Assistant is not installable here; its tests will be skipped" >&2
fi

# Real v2 (KServe REST) servers, MLServer and KServe, for tests/integration/test_v2_servers.py and
# the far tier `escalate.to_v2` (their own venvs in .cache/v2-venvs, ~2 min once; never a
# dependency of the daemon). Optional: where they cannot be installed those tests skip.
if [ -n "${EDGE_INFERD_SKIP_V2:-}" ]; then
    echo "test: EDGE_INFERD_SKIP_V2 is set: the v2 servers are not installed, their tests skip" >&2
else
    ./scripts/setup_v2.sh || echo "test: the v2 servers (MLServer, KServe) are not installable here; their tests will be skipped" >&2
fi

./scripts/fetch_test_models.sh .cache/test-models
export EDGE_INFERD_TEST_MODELS="$PWD/.cache/test-models"

# Two parts, so the suite fits its 10 minutes on 2 cores: most tests wait on brokers and daemons,
# so two pytest workers (pytest-xdist, a test file per worker at a time: its module fixtures are
# made once) run them side by side; the tests marked `serial` measure time or CPU (busy loops,
# capacity, latency bounds) and run alone afterwards. EDGE_INFERD_TEST_WORKERS sets the workers
# (0: everything in one process, in order).
WORKERS=${EDGE_INFERD_TEST_WORKERS:-2}
if [ "$WORKERS" = "0" ]; then
    exec .venv/bin/python -m pytest "$@"
fi
status=0
.venv/bin/python -m pytest -n "$WORKERS" --dist loadfile -m "not serial" "$@" || status=$?
serial=0
.venv/bin/python -m pytest -m serial -p no:xdist "$@" || serial=$?
[ "$serial" -eq 5 ] && serial=0  # the arguments picked no serial test: nothing to run is not a failure
[ "$status" -eq 5 ] && status=0
[ "$status" -ne 0 ] && exit "$status"
exit "$serial"
