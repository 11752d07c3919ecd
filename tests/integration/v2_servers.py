"""Real Open Inference Protocol (KServe v2 REST) servers as processes: MLServer 1.7.1 and KServe
0.21.0, each from its own venv (scripts/setup_v2.sh), serving models/appliance_large through the
small runtime in tests/integration/v2_apps/ (copied into the server's directory, as a user
would deploy it). The far tier `escalate.to_v2` talks to them in its tests.

Contract of the runtime (the far tier's): one FP32 input [N, 1460, 1] or [N, 1460] (the near
node's `escalate.preprocess` already applied); one FP32 output `scores` [N, 10], what the daemon's
own runtime gives for those rows; any other shape or datatype a JSON 400. Model metadata says so.

What each server takes (read in their sources, checked by tests/integration/test_v2_servers.py):
- KServe: JSON only with `Content-Type: application/json`; the binary tensor extension on input
  (`Inference-Header-Content-Length`, with application/octet-stream or no content type: with
  application/json it is a 400) and on output (`binary_data_output`; a requested output's own
  `parameters.binary_data`, which overrides it: an output asked for by name without it comes back
  JSON). A binary response carries `Inference-Header-Content-Length` and no Content-Type.
- MLServer: JSON whatever the content type; no binary extension over REST (its REST body is a
  pydantic model: a binary body is a 422, or a plain-text 500 with application/octet-stream).
  A model's uncaught exception is a plain-text 500 that closes the keep-alive connection.
Both bind 127.0.0.1 and reach no network. Each starts in ~2-3 s on 2 cores.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Optional

import numpy as np
import pytest

from daemon.model import preprocess
from daemon.model.runtime import Model
from daemon.tools.broker import end_process, free_port

ROOT = Path(__file__).resolve().parents[2]
VENVS = Path(os.environ.get("EDGE_INFERD_V2_VENVS", ROOT / ".cache" / "v2-venvs"))
READY_MARK = "edge-inferd-v2-ready"  # scripts/setup_v2.sh writes it once a venv is complete
APPS = Path(__file__).resolve().parent / "v2_apps"  # run by the v2 venvs' pythons, never imported here
MODEL_NAME = "appliance_large"
MODEL = ROOT / "models" / MODEL_NAME / "model.tflite"
MLSERVER, KSERVE = "mlserver", "kserve"
KINDS = (MLSERVER, KSERVE)
LOOPBACK = "127.0.0.1"
START_TIMEOUT_S = 60.0  # ~2.5 s measured; the bound only decides how long a broken start takes to fail
POLL_S = 0.05
STOP_TIMEOUT_S = 10.0
_OK = 200


def far_rows(n: int) -> np.ndarray:
    """n traces of models/appliance/test.npz, spread over the split (it is sorted by appliance,
    ten traces each), as the far tier receives them: the near node's `escalate.preprocess`,
    appliance_large's own steps from its card (standardize, clip, reshape to [1460, 1]), applied
    to the decoded input (as benchmarks/measure_cascade.py does)."""
    card = json.loads((MODEL.parent / "card.json").read_text())
    steps = tuple(preprocess.parse_step(step) for step in card["preprocessing"])
    with np.load(ROOT / "models" / "appliance" / "test.npz") as data:
        x = data["x"]
        picked = x[np.linspace(0, len(x) - 1, n).astype(int)]
    return preprocess.apply_steps(steps, picked.astype(np.float32))


def daemon_scores(rows: np.ndarray) -> np.ndarray:
    """What edge-inferd's own runtime gives for these far rows: (N, 10) float32."""
    return Model(MODEL).infer(rows)


def available(kind: str) -> Optional[str]:
    """Why the `kind` server cannot run here, or None when it can."""
    if not (VENVS / kind / READY_MARK).exists():
        return f"no finished {kind} venv at {VENVS / kind}: run ./scripts/setup_v2.sh (about 2 min, once)"
    return None


def python_of(kind: str) -> Path:
    return VENVS / kind / "bin" / "python"


def sklearn_available() -> Optional[str]:
    """Why MLServer's own scikit-learn runtime (mlserver-sklearn) cannot run here, or None."""
    reason = available(MLSERVER)
    if reason is None and not list((VENVS / MLSERVER).glob("lib/python*/site-packages/mlserver_sklearn")):
        reason = f"no mlserver-sklearn in {VENVS / MLSERVER}: run ./scripts/setup_v2.sh"
    return reason


class V2Server:
    """One server process; `url` (http://127.0.0.1:PORT), `model`, `proc` (SIGKILL it to test a
    far tier that dies mid-stream), `restart()` on the same port, `log()` for failure messages.
    `model`: appliance_large on the runtime of v2_apps/, or (MLServer only) a model of the
    caller's, whose folder (its model-settings.json and files) is already in `workdir`."""

    def __init__(self, kind: str, workdir: Path, model: str = MODEL_NAME):
        self.kind, self.dir, self.model = kind, workdir, model
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        self.log_path = self.dir / "server.log"
        self.proc: Optional[subprocess.Popen] = None
        self.start_s = 0.0  # how long the last start took until the model was ready
        if kind == MLSERVER:
            self._command = _write_mlserver(self.dir, self.port, own_model=model != MODEL_NAME)
        else:
            self._command = _write_kserve(self.dir, self.port)

    def start(self) -> V2Server:
        started = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self._command, cwd=self.dir, stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self._wait_ready()
        self.start_s = time.monotonic() - started
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            if self.get(f"/v2/models/{self.model}/ready")[0] == _OK:
                return
            time.sleep(POLL_S)  # polling a port that opens once the model is loaded; the limit bounds a failure
        raise RuntimeError(f"{self.kind}: model {self.model} not ready within {START_TIMEOUT_S:.0f} s:\n"
                           f"{self.log()[-3000:]}")

    def get(self, path: str) -> tuple[int, bytes]:
        """GET on the server: (status, body); (0, b"") while nothing listens."""
        conn = http.client.HTTPConnection(LOOPBACK, self.port, timeout=STOP_TIMEOUT_S)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            return response.status, response.read()
        except OSError:
            return 0, b""
        finally:
            conn.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None:
            end_process(self.proc, sig, STOP_TIMEOUT_S)

    def restart(self) -> V2Server:
        """Kill it (if still running) and start it again on the same port and url."""
        self.kill()
        return self.start()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def _copy_runtime(directory: Path, *names: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("tflite_scores.py", *names):
        shutil.copy(APPS / name, directory / name)


def _write_mlserver(workdir: Path, port: int, own_model: bool = False) -> list[str]:
    """settings.json and a model folder (named as the model: MLServer warns otherwise), unless the
    caller put its own there (`own_model`: MLServer serves every model-settings.json under
    `workdir`). gRPC cannot be turned off, so it gets a free port too; metrics (another port) and
    parallel workers (a process per model, which a SIGKILL of the server would orphan) are off."""
    settings = {"host": LOOPBACK, "http_port": port, "grpc_port": free_port(), "metrics_endpoint": None,
                "parallel_workers": 0, "debug": False}
    (workdir / "settings.json").write_text(json.dumps(settings))
    command = [str(VENVS / MLSERVER / "bin" / "mlserver"), "start", str(workdir)]
    if own_model:
        return command
    model_dir = workdir / MODEL_NAME
    _copy_runtime(model_dir, "mlserver_runtime.py")
    model_settings = {"name": MODEL_NAME, "implementation": "mlserver_runtime.TFLiteScores",
                      "parameters": {"uri": str(MODEL)}}
    (model_dir / "model-settings.json").write_text(json.dumps(model_settings))
    return command


def _write_kserve(workdir: Path, port: int) -> list[str]:
    _copy_runtime(workdir, "kserve_server.py")
    return [str(python_of(KSERVE)), str(workdir / "kserve_server.py"), "--model_name", MODEL_NAME,
            "--model_path", str(MODEL), "--http_port", str(port), "--enable_grpc", "false"]


class V2Pool:
    """The servers of one test module, started on first use (one per kind) and revived for the
    next test when one killed its server. Servers outlive a test: starting one costs ~2.5 s."""

    def __init__(self, workdir):
        self._workdir = workdir  # a callable: kind -> a fresh directory
        self._servers: dict[str, V2Server] = {}

    def get(self, kind: str) -> V2Server:
        reason = available(kind)
        if reason is not None:
            pytest.skip(reason)
        server = self._servers.get(kind)
        if server is None:
            server = self._servers[kind] = V2Server(kind, self._workdir(kind))
            return server.start()
        return server if server.alive() else server.restart()

    def close(self) -> None:
        for server in self._servers.values():
            server.kill(signal.SIGTERM)
