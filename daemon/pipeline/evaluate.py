"""`validate` and the deep check: the accuracy gate of a route's model (`bench model` is in daemon/tools/bench/model.py).

`validate` runs exactly the daemon's path for each sample (route preprocessing, then
quantize, invoke, dequantize, postprocess through `daemon.pipeline`), so its numbers
are the daemon's numbers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from daemon.config.schema import Config, RouteConfig
from daemon.config.model_files import open_model
from daemon.errors import DaemonError
from daemon.pipeline.route_pipeline import RoutePipeline, route_pipeline
from daemon.model.runtime import Model

# Samples per invoke when scoring a whole split (the models' batch dimension is dynamic).
_EVAL_BATCH = 64
# Tolerance for comparing accuracies that are ratios of small integers.
_EPS = 1e-9


def find_route(config: Config, name: str) -> RouteConfig:
    for route in config.routes:
        if route.name == name:
            return route
    known = ", ".join(r.name for r in config.routes)
    raise DaemonError(f"--route: no route named {name!r} (known: {known})")


def load_split(path: Path | str, route: RouteConfig) -> tuple[np.ndarray, np.ndarray]:
    """x (N, *route.input.shape) and y (N,) ints from an .npz file, checked."""
    try:
        with np.load(path, allow_pickle=False) as data:
            x, y = data["x"], data["y"]
    except FileNotFoundError:
        raise DaemonError(f"--data: {path}: file not found") from None
    except (KeyError, ValueError, OSError) as exc:
        raise DaemonError(f"--data: {path}: expected an .npz with arrays 'x' and 'y' ({exc})") from None
    if x.shape[1:] != route.input.shape or y.shape != (x.shape[0],):
        raise DaemonError(f"--data: {path}: x {list(x.shape)} / y {list(y.shape)} do not fit route "
                          f"{route.name!r} input {list(route.input.shape)}")
    return x.astype(np.float32), y.astype(np.int64)


def predict(pipe: RoutePipeline, model: Model, x: np.ndarray) -> np.ndarray:
    """Top-1 index per sample through the route's pipeline (no cache)."""
    out = []
    for start in range(0, len(x), _EVAL_BATCH):
        scores = model.infer(pipe.preprocess(x[start : start + _EVAL_BATCH]))
        out.extend(int(pipe.postprocess(s, None, False, 0.0)["index"]) for s in scores)
    return np.array(out, dtype=np.int64)


def validate(config: Config, route_name: str, data: Path | str, float_model: Optional[Path | str] = None,
             max_drop: float = 0.01, min_accuracy: float = 0.0) -> tuple[dict, bool]:
    """The report and whether it passes the gate (drop <= max_drop, accuracy >= min_accuracy)."""
    route = find_route(config, route_name)
    model = open_model(config, route.model)
    pipe = route_pipeline(config, route, model)
    x, y = load_split(data, route)
    pred = predict(pipe, model, x)
    report = {"route": route.name, "model": route.model, "backend": model.backend, "n": int(len(y)),
              "accuracy": round(float(np.mean(pred == y)), 6), "model_sha256": model.sha256}
    ok = report["accuracy"] + _EPS >= min_accuracy
    if float_model is not None:
        reference = Model(float_model, backend=config.runtime, require_int8=False, xnnpack=config.xnnpack)
        float_pred = predict(pipe, reference, x)
        report["float_accuracy"] = round(float(np.mean(float_pred == y)), 6)
        report["drop"] = round(report["float_accuracy"] - report["accuracy"], 6)
        report["agreement"] = round(float(np.mean(float_pred == pred)), 6)
        report["max_drop"] = max_drop
        ok = ok and report["drop"] <= max_drop + _EPS
    report["passed"] = ok
    return report, ok


def deep_check(config: Config) -> list[str]:
    """What `check-config --deep` adds to a valid config: one invoke per model, and each route's
    `validate` gate where it names data. Problems, one line each (empty: passed)."""
    problems = []
    for name in config.models:
        try:
            open_model(config, name, max_batch=1).warm_up()
        except Exception as exc:  # a model that loads but cannot run: anything the runtime raises
            problems.append(f"models.{name}: invoke failed: {type(exc).__name__}: {exc}")
    for i, route in enumerate(config.routes):
        if route.validate_data is None or any(p.startswith(f"models.{route.model}:") for p in problems):
            continue
        report, ok = validate(config, route.name, route.validate_data, min_accuracy=route.min_accuracy)
        if not ok:
            problems.append(f"routes[{i}].validate: accuracy {report['accuracy']:.4f} on {route.validate_data} "
                            f"is below min_accuracy {route.min_accuracy}")
    return problems
