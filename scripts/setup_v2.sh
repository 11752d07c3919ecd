#!/usr/bin/env bash
# Real Open Inference Protocol (KServe v2 REST) servers for tests/integration/test_v2_servers.py
# and the far tier `escalate.to_v2`: MLServer and KServe, each in its own venv under
# .cache/v2-venvs (or $1), since their pins conflict (pydantic, fastapi, uvicorn, numpy...).
# Never a run-time dependency of edge-inferd: these are what the daemon talks to in the tests.
#   ./scripts/setup_v2.sh [DIR]
# The MLServer venv also gets mlserver-sklearn, MLServer's own scikit-learn runtime, for the
# far-tier sklearn example of docs/http.md (tests/integration/test_far_v2.py).
# Each venv also gets a TFLite interpreter for the test's own runtime (written by the test into
# its tmp_path): ai-edge-litert, the daemon's own backend at the daemon's own version when .venv
# has it (so a server's INT8 scores are bit for bit the daemon's), or tflite-runtime with numpy<2
# where the server's numpy pin keeps litert out.
# Idempotent: a venv whose ready marker exists is only checked.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-.cache/v2-venvs}"
MLSERVER_VERSION="1.7.1"  # mlserver-sklearn is released with it, at the same version
KSERVE_VERSION="0.21.0"
READY_MARK="edge-inferd-v2-ready"  # written last: the tests start a server only from a finished venv

LITERT="ai-edge-litert"
if DAEMON_LITERT="$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("ai-edge-litert"))' 2>/dev/null)"; then
    LITERT="ai-edge-litert==$DAEMON_LITERT"
fi

# The smoke test constructs and invokes: tflite-runtime with numpy 2 imports, then fails in Interpreter().
SMOKE='
import numpy as np, sys
try:
    from ai_edge_litert.interpreter import Interpreter
except ImportError:
    from tflite_runtime.interpreter import Interpreter
interp = Interpreter(model_path=sys.argv[1])
interp.allocate_tensors()
detail = interp.get_input_details()[0]
interp.set_tensor(detail["index"], np.zeros(detail["shape"], detail["dtype"]))
interp.invoke()
'
MODEL="models/appliance_large/model.tflite"

ready() {  # $1 venv, $2 import check
    [ -f "$1/$READY_MARK" ] && [ "$(cat "$1/$READY_MARK")" = "$LITERT" ] \
        && "$1/bin/python" -c "$2" 2>/dev/null && "$1/bin/python" -c "$SMOKE" "$MODEL" 2>/dev/null
}

install() {  # $1 venv, $2 the server's requirements (one word each), $3 import check
    local venv="$1"
    local -a requirements
    read -r -a requirements <<< "$2"
    if ready "$venv" "$3"; then
        return 0
    fi
    echo "setup_v2: installing $2 into $venv" >&2
    rm -f "$venv/$READY_MARK"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    # One resolve with the server's pins: pip refuses (installing nothing) if litert cannot join them.
    if ! "$venv/bin/python" -m pip install -q "${requirements[@]}" "$LITERT" numpy; then
        echo "setup_v2: $LITERT does not install beside $2; trying tflite-runtime with numpy<2" >&2
        "$venv/bin/python" -m pip install -q "${requirements[@]}" 'tflite-runtime==2.14.*' 'numpy<2'
    fi
    "$venv/bin/python" -c "$3"
    "$venv/bin/python" -c "$SMOKE" "$MODEL"
    echo "$LITERT" > "$venv/$READY_MARK"
    echo "setup_v2: $2 ready in $venv" >&2
}

mkdir -p "$DIR"
install "$DIR/mlserver" "mlserver==$MLSERVER_VERSION mlserver-sklearn==$MLSERVER_VERSION" \
    "import mlserver, mlserver_sklearn, sklearn; assert mlserver.__version__ == '$MLSERVER_VERSION'"
install "$DIR/kserve" "kserve==$KSERVE_VERSION" \
    "import importlib.metadata as m, kserve; assert m.version('kserve') == '$KSERVE_VERSION'"
