"""Object detection: a detector's dequantized outputs -> scored, labelled boxes in the sent image's pixels.

Two model families are understood, told apart by their output shapes
(daemon/model/interface.py, `detector_layout`):

- **SSD** with TFLite_Detection_PostProcess: four outputs, boxes (N, 4) as ymin, xmin, ymax,
  xmax in [0, 1] of the model input, classes (N,) as float label-map ids, scores (N,) and a
  count of valid rows. The model has already run its own NMS; `ssd` only filters and sorts.
- **YOLO** (ultralytics-style export): one output, (4 + C, A) or (A, 4 + C) for A anchors and
  C classes, rows cx, cy, w, h then one score per class (no objectness column). `yolo` takes
  each anchor's best class and runs per-class greedy NMS.

Every box here is normalized to the model input (x right, y down); `to_reply` maps it to the
image as sent through its `Geometry` (stretched or letterboxed), so a device gets boxes in
the pixels it knows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from daemon.pipeline.geometry import Geometry

DEFAULT_IOU = 0.45
"""Ultralytics' default NMS IoU threshold: a same-class box overlapping a better one by more is dropped."""
BOX_COORDS = 4
"""cx, cy, w, h (YOLO) or ymin, xmin, ymax, xmax (SSD)."""
PIXEL_COORDS_ABOVE = 1.5
"""A YOLO output whose largest cx, cy, w or h exceeds this is in input pixels, not [0, 1]
(normalized boxes may stray a little past 1; pixel boxes of any real input are far above)."""
SCORE_DECIMALS = 6
PIXEL_DECIMALS = 1


@dataclass(frozen=True)
class Box:
    """Normalized to the model input, 0..1, x right, y down."""
    x_min: float
    y_min: float
    x_max: float
    y_max: float


@dataclass(frozen=True)
class Detection:
    index: int
    """The class id as the model emits it (SSD: label-map id; YOLO: class column)."""
    score: float
    box: Box
    keypoints: tuple[tuple[float, float], ...] = ()
    """(x, y) points normalized to the model input like the box (decode: anchors only: BlazeFace's
    eyes, nose, mouth and ears); not clamped, a point may lie a little outside the input."""


def ssd(boxes, classes, scores, count, min_score: float, max_results: int) -> list[Detection]:
    """The first `count` rows scoring at least `min_score`, best first, at most `max_results`."""
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    classes = np.asarray(classes).reshape(-1)
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, BOX_COORDS)
    # The post-process op reports how many rows are real, but many exports always say N and
    # pad with score 0 rows: the count bounds the rows, the score filter does the rest.
    valid = min(max(int(np.rint(np.asarray(count, dtype=np.float64).reshape(-1)[0])), 0), scores.size)
    keep = np.flatnonzero(scores[:valid] >= min_score)
    keep = keep[np.argsort(-scores[keep], kind="stable")][:max(max_results, 0)]
    ymin, xmin, ymax, xmax = _clamped(boxes[keep]).T
    return [Detection(int(np.rint(classes[i])), float(scores[i]), _box(x0, y0, x1, y1))
            for i, x0, y0, x1, y1 in zip(keep, xmin, ymin, xmax, ymax)]


def yolo(output: np.ndarray, min_score: float, max_results: int, input_size: tuple[int, int],
         iou: float = DEFAULT_IOU) -> list[Detection]:
    """Each anchor's best class, at least `min_score`, through per-class NMS, best first, at most
    `max_results`. `input_size` is the model input's (width, height), for pixel coordinates."""
    rows = _anchor_rows(np.asarray(output, dtype=np.float64))
    xywh, class_scores = rows[:, :BOX_COORDS], rows[:, BOX_COORDS:]
    if xywh.size and np.max(xywh) > PIXEL_COORDS_ABOVE:
        width, height = input_size
        xywh = xywh / np.array([width, height, width, height], dtype=np.float64)
    best = np.argmax(class_scores, axis=1)
    score = class_scores[np.arange(len(rows)), best]
    candidates = np.flatnonzero(score >= min_score)
    cx, cy, w, h = xywh[candidates].T
    corners = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
    kept = _per_class_nms(corners, score[candidates], best[candidates], iou, max(max_results, 0))
    chosen = candidates[kept]
    x0, y0, x1, y1 = _clamped(corners[kept]).T
    return [Detection(int(best[i]), float(score[i]), _box(*c)) for i, *c in zip(chosen, x0, y0, x1, y1)]


def _anchor_rows(output: np.ndarray) -> np.ndarray:
    """(A, 4 + C) whichever way the model lays it out: the shorter axis holds the 4 + C values
    (A is in the thousands); a square output is read as (4 + C, A), as ultralytics writes it."""
    if output.ndim != 2 or min(output.shape) <= BOX_COORDS:
        raise ValueError(f"a YOLO output is (4 + C, A) or (A, 4 + C) with C >= 1, not {output.shape}")
    features, anchors = output.shape
    return output.T if features <= anchors else output


def _per_class_nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, iou: float,
                   limit: int) -> np.ndarray:
    """NMS within each class at once: each class is shifted to its own region, farther apart
    than any box is wide, so boxes of different classes never overlap (torchvision's trick)."""
    if not len(boxes):
        return np.empty(0, dtype=np.intp)
    spread = np.max(np.abs(boxes)) * 2 + 1
    return _greedy_nms(boxes + (classes * spread)[:, None], scores, iou, limit)


def nms(boxes: np.ndarray, scores: np.ndarray, iou: float, limit: Optional[int] = None) -> np.ndarray:
    """Greedy non-maximum suppression over xyxy `boxes`: the indices kept, best score first, at
    most `limit` (None: all). A box overlapping a kept one by IoU above `iou` is dropped; equal
    scores keep input order."""
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, BOX_COORDS)
    most = len(boxes) if limit is None else max(limit, 0)
    return _greedy_nms(boxes, np.asarray(scores, dtype=np.float64).reshape(-1), iou, most)


def _greedy_nms(boxes: np.ndarray, scores: np.ndarray, iou: float, limit: int) -> np.ndarray:
    # The greedy pass keeps boxes in score order, so its first `limit` are final: stop there.
    order = np.argsort(-scores, kind="stable")
    areas = _areas(boxes)
    kept: list[int] = []
    while order.size and len(kept) < limit:
        best, rest = order[0], order[1:]
        kept.append(int(best))
        order = rest[_overlaps(boxes[best], areas[best], boxes[rest], areas[rest]) <= iou]
    return np.array(kept, dtype=np.intp)


def iou(a: Box, b: Box) -> float:
    """Intersection over union of two boxes; 0.0 when both are empty."""
    one = np.array([a.x_min, a.y_min, a.x_max, a.y_max], dtype=np.float64)
    other = np.array([[b.x_min, b.y_min, b.x_max, b.y_max]], dtype=np.float64)
    return float(_overlaps(one, _areas(one[None])[0], other, _areas(other))[0])


def ious(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    """IoU of one xyxy box with each xyxy row of `others` (0 where the union is empty)."""
    box = np.asarray(box, dtype=np.float64).reshape(BOX_COORDS)
    others = np.asarray(others, dtype=np.float64).reshape(-1, BOX_COORDS)
    return _overlaps(box, _areas(box[None])[0], others, _areas(others))


def _areas(boxes: np.ndarray) -> np.ndarray:
    return np.clip(boxes[:, 2] - boxes[:, 0], 0, None) * np.clip(boxes[:, 3] - boxes[:, 1], 0, None)


def _overlaps(box: np.ndarray, area: float, others: np.ndarray, areas: np.ndarray) -> np.ndarray:
    """IoU of one xyxy box with each of `others` (0 where the union is empty, not a division by 0)."""
    width = np.clip(np.minimum(box[2], others[:, 2]) - np.maximum(box[0], others[:, 0]), 0, None)
    height = np.clip(np.minimum(box[3], others[:, 3]) - np.maximum(box[1], others[:, 1]), 0, None)
    inter = width * height
    union = area + areas - inter
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def _clamped(boxes: np.ndarray) -> np.ndarray:
    # Boxes may stray a little outside the input; a reply's box stays inside it.
    return np.clip(boxes, 0.0, 1.0)


def _box(x0: float, y0: float, x1: float, y1: float) -> Box:
    """A Box with its corners in order, whichever way round the model wrote them."""
    return Box(float(min(x0, x1)), float(min(y0, y1)), float(max(x0, x1)), float(max(y0, y1)))


def to_reply(detections: Sequence[Detection], labels: Callable[[int], str], geometry: Geometry) -> list[dict]:
    """The reply's detections, each box (and keypoint, for a detector that finds them) in pixels
    of the image as sent."""
    replies = []
    for d in detections:
        x_min, y_min = geometry.normalized_to_sent(d.box.x_min, d.box.y_min)
        x_max, y_max = geometry.normalized_to_sent(d.box.x_max, d.box.y_max)
        box = {"x_min": round(x_min, PIXEL_DECIMALS), "y_min": round(y_min, PIXEL_DECIMALS),
               "x_max": round(x_max, PIXEL_DECIMALS), "y_max": round(y_max, PIXEL_DECIMALS)}
        reply = {"label": labels(d.index), "index": d.index, "score": round(d.score, SCORE_DECIMALS), "box": box}
        if d.keypoints:
            reply["keypoints"] = [[round(v, PIXEL_DECIMALS) for v in geometry.normalized_to_sent(x, y)]
                                  for x, y in d.keypoints]
        replies.append(reply)
    return replies
