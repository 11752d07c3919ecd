"""Run in the tflite-runtime venv (numpy<2): score each model's test split, write an .npz.

    python tests/parity_helper.py OUT.npz MODEL_DIR ROUTE CONFIG [...]
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from daemon.config.loader import load_config  # noqa: E402
from daemon.pipeline.evaluate import find_route  # noqa: E402
from daemon.pipeline.route_pipeline import RoutePipeline  # noqa: E402
from daemon.model.runtime import Model  # noqa: E402


def main(out: str, *triples: str) -> None:
    results = {}
    for model_dir, route_name, config_path in zip(triples[::3], triples[1::3], triples[2::3], strict=True):
        config = load_config(config_path, check_models=False)
        route = find_route(config, route_name)
        model = Model(Path(model_dir) / "model.tflite", backend="tflite")
        with np.load(Path(model_dir) / "test.npz") as data:
            x = data["x"]
        pipe = RoutePipeline.build(route, model.sha256, [])
        results[route_name] = model.infer(pipe.preprocess(x))
        results[f"{route_name}__backend"] = np.array(model.backend)
    np.savez(out, **results)


if __name__ == "__main__":
    main(*sys.argv[1:])
