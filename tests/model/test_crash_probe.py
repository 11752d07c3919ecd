"""A model that crashes tflite-runtime is a config error that names its key, not a crashed daemon.

tflite-runtime 2.14 does not verify the flatbuffer: half of a model kills the loading process
with SIGSEGV (x86-64 and armv7). Run in the tflite-runtime environment the suite sets up
(EDGE_INFERD_TFLITE_PYTHON), as `check-config` and `run` would be on armv7.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TFLITE_PYTHON = os.environ.get("EDGE_INFERD_TFLITE_PYTHON")
ACTIVITY = ROOT / "models/activity"


@pytest.fixture
def tflite_python():
    if not TFLITE_PYTHON:
        pytest.skip("EDGE_INFERD_TFLITE_PYTHON is not set; ./scripts/test.sh sets it up")
    return TFLITE_PYTHON


def _config(tmp_path: Path, model: Path) -> Path:
    raw = yaml.safe_load((ROOT / "config.yaml").read_text())
    routes = [r for r in raw["routes"] if r["model"] == "activity"]
    for route in routes:
        route.pop("validate", None)
    raw.update(runtime="tflite", routes=routes,
               models={"activity": {"path": str(model), "labels": str(ACTIVITY / "labels.txt")}})
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_half_a_model_is_an_error_naming_its_key_where_tflite_runtime_would_crash(tmp_path, tflite_python):
    data = (ACTIVITY / "model.tflite").read_bytes()
    half = tmp_path / "half.tflite"
    half.write_bytes(data[: len(data) // 2])
    load = subprocess.run([tflite_python, "-c", "import sys; from daemon.model.runtime import Model; "
                           "Model(sys.argv[1], backend='tflite')", str(half)], cwd=ROOT, capture_output=True)
    if load.returncode >= 0:
        pytest.skip(f"this tflite-runtime loads half a model without crashing (exit {load.returncode})")
    check = subprocess.run([tflite_python, "-m", "daemon", "check-config", "--config", str(_config(tmp_path, half))],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert check.returncode == 78, check.stderr  # EXIT_CONFIG, not killed by a signal
    assert "models.activity.path" in check.stderr and "crashed loading it (killed by SIGSEGV)" in check.stderr


def test_a_whole_model_passes_the_probe_and_loads(tmp_path, tflite_python):
    check = subprocess.run([tflite_python, "-m", "daemon", "check-config", "--config",
                            str(_config(tmp_path, ACTIVITY / "model.tflite"))],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stderr
