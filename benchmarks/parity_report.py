"""How far ai-edge-litert's scores are from tflite-runtime's on this machine, per bundled model.

    .venv/bin/python benchmarks/parity_report.py [TFLITE_PYTHON | SCORES.npz]   (default: .venv-tflite/bin/python)

Scores every test sample of the models tests/model/test_parity.py checks: tflite-runtime in
its own venv (tests/parity_helper.py), litert here with XNNPACK (the default) and without
(`xnnpack: false`). Prints one line per model and setting: the machine, the worst difference
in output quantization steps, on how many samples the scores differ at all, and whether the
top-1 is the same on every sample. docs/models.md and docs/platforms.md quote its lines.

SCORES.npz instead: tflite-runtime's scores written elsewhere by tests/parity_helper.py (the
same arguments as below), e.g. on an armv7 machine, which has no litert: litert here is then
compared with tflite-runtime there, and the lines say so.
"""

from __future__ import annotations

import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from daemon.config.loader import load_config  # noqa: E402
from daemon.model.runtime import Model  # noqa: E402
from daemon.pipeline.evaluate import find_route  # noqa: E402
from daemon.pipeline.route_pipeline import RoutePipeline  # noqa: E402
from tests.model.test_parity import MODELS  # noqa: E402


def main(tflite_python: str) -> None:
    machine = platform.machine()
    if tflite_python.endswith(".npz"):  # scored elsewhere (tests/parity_helper.py there)
        with np.load(tflite_python) as data:
            tflite = {k: data[k] for k in data.files}
        machine = f"{machine} (litert) vs {tflite_python} (tflite-runtime):"
    else:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "tflite.npz"
            args = [str(v) for triple in MODELS for v in triple]
            subprocess.run([tflite_python, str(ROOT / "tests/parity_helper.py"), str(out), *args], check=True)
            with np.load(out) as data:
                tflite = {k: data[k] for k in data.files}
    for model_dir, route_name, config in MODELS:
        route = find_route(load_config(config, check_models=False), route_name)
        with np.load(model_dir / "test.npz") as data:
            x = data["x"]
        for xnnpack in (True, False):
            model = Model(model_dir / "model.tflite", backend="litert", xnnpack=xnnpack)
            litert = model.infer(RoutePipeline.build(route, model.sha256, []).preprocess(x))
            steps = np.abs(litert - tflite[route_name]) / model.output.scale
            differ = int((steps.max(axis=1) > 1e-4).sum())
            same_top1 = bool(np.array_equal(litert.argmax(axis=1), tflite[route_name].argmax(axis=1)))
            print(f"{machine} {route_name:16s} xnnpack={str(xnnpack).lower():5s} max {steps.max():5.1f} steps, "
                  f"{differ}/{len(x)} samples differ, same top-1: {'yes' if same_top1 else 'NO'}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(ROOT / ".venv-tflite/bin/python"))
