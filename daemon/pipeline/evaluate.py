"""`validate` and the deep check: the accuracy gate of a route's model (`bench model` is in daemon/tools/bench/model.py).

`validate` runs exactly the daemon's path for each sample (route preprocessing, then
quantize, invoke, dequantize, postprocess through `daemon.pipeline`), so its numbers
are the daemon's numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from daemon.config.schema import ANOMALY, DETECT, VALUES, Config, RouteConfig
from daemon.config.model_files import open_model
from daemon.errors import DaemonError
from daemon.pipeline import request_path, scoring
from daemon.pipeline.kinds import anomaly
from daemon.pipeline.kinds.detect import Box
from daemon.pipeline.route_pipeline import RoutePipeline, route_pipeline
from daemon.model.runtime import Model

# Samples per invoke when scoring a whole split (the models' batch dimension is dynamic).
_EVAL_BATCH = 64
# Tolerance for comparing accuracies that are ratios of small integers.
_EPS = 1e-9
# A labelled box: image index, class id, x_min, y_min, x_max, y_max.
BOX_COLUMNS = 6
# The false-positive rate on normal samples at which `validate` reports an anomaly threshold.
DEFAULT_FPR = 0.05


def find_route(config: Config, name: str) -> RouteConfig:
    for route in config.routes:
        if route.name == name:
            return route
    known = ", ".join(r.name for r in config.routes)
    raise DaemonError(f"--route: no route named {name!r} (known: {known})")


def load_split(path: Path | str, route: RouteConfig) -> tuple[np.ndarray, np.ndarray]:
    """x (N, *route.input.shape) and y (N, ...) from an .npz file, checked: integer labels
    (classify), 0 normal / 1 anomalous (anomaly) or the target values (values)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            x, y = data["x"], data["y"]
    except FileNotFoundError:
        raise DaemonError(f"--data: {path}: file not found") from None
    except (KeyError, ValueError, OSError) as exc:
        raise DaemonError(f"--data: {path}: expected an .npz with arrays 'x' and 'y' ({exc})") from None
    rows_ok = y.ndim >= 1 and y.shape[0] == x.shape[0] and (route.kind == VALUES or y.ndim == 1)
    if x.shape[1:] != route.input.shape or not rows_ok:
        raise DaemonError(f"--data: {path}: x {list(x.shape)} / y {list(y.shape)} do not fit route "
                          f"{route.name!r} input {list(route.input.shape)}")
    return x.astype(np.float32), (y.astype(np.float32) if route.kind == VALUES else y.astype(np.int64))


def outputs(pipe: RoutePipeline, model: Model, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every sample through the route's pipeline (no cache): the model's output rows, and its
    real-valued inputs (what an autoencoder reconstructs)."""
    rows, inputs = [], []
    for start in range(0, len(x), _EVAL_BATCH):
        pre = pipe.preprocess(x[start : start + _EVAL_BATCH])
        rows.append(model.infer_quantized(model.quantize(pre, pipe.pixels_as_is)))
        inputs.append(pre.reshape(len(pre), -1))
    return np.concatenate(rows), np.concatenate(inputs)


def predict(pipe: RoutePipeline, model: Model, x: np.ndarray) -> np.ndarray:
    """Top-1 index per sample through the route's pipeline (no cache)."""
    rows, _ = outputs(pipe, model, x)
    return np.argmax(rows, axis=1).astype(np.int64)  # argmax keeps the first of equal scores, as the replies do


def answers(pipe: RoutePipeline, model: Model, x: np.ndarray) -> tuple[Optional[np.ndarray], np.ndarray]:
    """What the route's replies would say of each sample, as drift watches it (daemon/obs/drift.py):
    (top-1 index, its score) for a classifier, (None, anomaly score) for an autoencoder."""
    rows, inputs = outputs(pipe, model, x)
    if pipe.route.kind == ANOMALY:
        return None, anomaly.anomaly_score(inputs, rows)
    best = np.argmax(rows, axis=1)
    return best.astype(np.int64), rows[np.arange(len(rows)), best].astype(np.float64)


@dataclass(frozen=True)
class Gate:
    """What `validate` holds a route to (the CLI's flags, or the route's own `validate:` keys)."""

    min_accuracy: float = 0.0
    min_roc_auc: float = 0.0
    max_mae: Optional[float] = None
    fpr: float = DEFAULT_FPR
    max_drop: float = 0.01


def validate(config: Config, route_name: str, data: Path | str, float_model: Optional[Path | str] = None,
             gate: Gate = Gate()) -> tuple[dict, bool]:
    """The report and whether it passes the gate of the route's kind."""
    route = find_route(config, route_name)
    model = open_model(config, route.model)
    pipe = route_pipeline(config, route, model)
    report = {"route": route.name, "model": route.model, "kind": route.kind, "backend": model.backend,
              "model_sha256": model.sha256}
    if route.kind == DETECT:
        report.update(_detect(pipe, model, data))
        report["passed"] = True  # a report of precision and recall; no gate
        return report, True
    x, y = load_split(data, route)
    report["n"] = int(len(y))
    if route.kind == ANOMALY:
        ok = _anomaly(pipe, model, x, y, gate, report)
    elif route.kind == VALUES:
        ok = _values(pipe, model, x, y, gate, report)
    else:
        ok = _classify(pipe, model, x, y, gate, report, config, float_model)
    report["passed"] = ok
    return report, ok


def _classify(pipe: RoutePipeline, model: Model, x: np.ndarray, y: np.ndarray, gate: Gate, report: dict,
              config: Config, float_model: Optional[Path | str]) -> bool:
    pred = predict(pipe, model, x)
    report["accuracy"] = round(float(np.mean(pred == y)), 6)
    ok = report["accuracy"] + _EPS >= gate.min_accuracy
    if float_model is not None:
        reference = Model(float_model, backend=config.runtime, xnnpack=config.xnnpack)
        float_pred = predict(pipe, reference, x)
        report["float_accuracy"] = round(float(np.mean(float_pred == y)), 6)
        report["drop"] = round(report["float_accuracy"] - report["accuracy"], 6)
        report["agreement"] = round(float(np.mean(float_pred == pred)), 6)
        report["max_drop"] = gate.max_drop
        ok = ok and report["drop"] <= gate.max_drop + _EPS
    return ok


def _anomaly(pipe: RoutePipeline, model: Model, x: np.ndarray, y: np.ndarray, gate: Gate, report: dict) -> bool:
    rows, inputs = outputs(pipe, model, x)
    scores = anomaly.anomaly_score(inputs, rows)
    report["roc_auc"] = round(scoring.roc_auc(y, scores), 6)
    threshold, fpr, tpr = scoring.threshold_at_fpr(y, scores, gate.fpr)
    report.update({"threshold": round(threshold, 6), "fpr": round(fpr, 6), "tpr": round(tpr, 6),
                   "target_fpr": gate.fpr})
    return report["roc_auc"] + _EPS >= gate.min_roc_auc


def _values(pipe: RoutePipeline, model: Model, x: np.ndarray, y: np.ndarray, gate: Gate, report: dict) -> bool:
    rows, _ = outputs(pipe, model, x)
    if rows.shape[1] != int(np.prod(y.shape[1:], dtype=np.int64)):
        raise DaemonError(f"--data: y has {list(y.shape[1:])} values per sample; the model gives {rows.shape[1]}")
    target = y.reshape(len(y), -1)
    report["mae"] = round(scoring.mae(target, rows), 6)
    report["rmse"] = round(scoring.rmse(target, rows), 6)
    return gate.max_mae is None or report["mae"] <= gate.max_mae + _EPS


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
        gate = Gate(min_accuracy=route.min_accuracy, min_roc_auc=route.min_roc_auc, max_mae=route.max_mae)
        report, ok = validate(config, route.name, route.validate_data, gate=gate)
        if not ok:
            problems.append(f"routes[{i}].validate: {_shortfall(report, gate)} on {route.validate_data}")
    return problems


def load_boxes(path: Path | str) -> tuple[list[bytes], list[list[tuple[int, Box]]]]:
    """A labelled detection set: arrays `image_0`, `image_1`, ... each the bytes of a JPEG or PNG
    (uint8, as a camera sends it), and `boxes` (M, 6): image index, class id, x_min, y_min, x_max,
    y_max in that picture's pixels."""
    try:
        with np.load(path, allow_pickle=False) as data:
            pictures = [data[f"image_{i}"].tobytes() for i in range(sum(k.startswith("image_") for k in data))]
            boxes = data["boxes"]
    except FileNotFoundError:
        raise DaemonError(f"--data: {path}: file not found") from None
    except (KeyError, ValueError, OSError) as exc:
        raise DaemonError(f"--data: {path}: expected an .npz with image_0, image_1, ... and boxes ({exc})") from None
    if boxes.ndim != 2 or boxes.shape[1] != BOX_COLUMNS:
        raise DaemonError(f"--data: {path}: boxes must be (M, {BOX_COLUMNS}), not {list(boxes.shape)}")
    truth: list[list[tuple[int, Box]]] = [[] for _ in pictures]
    for image, cls, *corners in boxes.tolist():
        truth[int(image)].append((int(cls), Box(*corners)))
    return pictures, truth


def _detect(pipe: RoutePipeline, model: Model, data: Path | str) -> dict:
    """Every picture through the route's whole path, as a camera's request; precision and recall
    at IoU 0.5 against the labelled boxes, in the pictures' own pixels."""
    pictures, truth = load_boxes(data)
    predicted = []
    for picture in pictures:
        reply = request_path.handle(pipe, picture, model, None, 0.0, lambda: 0.0)
        if "error" in reply:
            raise DaemonError(f"--data: a picture was answered {reply['error']['code']}: {reply['error']['message']}")
        predicted.append([(d["index"], Box(**d["box"]), d["score"]) for d in reply["detections"]])
    return {"n": len(pictures), "boxes": sum(map(len, truth)), **scoring.detection_pr(predicted, truth)}


def _shortfall(report: dict, gate: Gate) -> str:
    if "roc_auc" in report:
        return f"ROC-AUC {report['roc_auc']:.4f} is below min_roc_auc {gate.min_roc_auc}"
    if "mae" in report:
        return f"MAE {report['mae']:.6g} is above max_mae {gate.max_mae}"
    return f"accuracy {report['accuracy']:.4f} is below min_accuracy {gate.min_accuracy}"
