"""Sub-labels' pure maths: which boxes of a detect reply are classified, the region of the sent
image each one's crop covers, and the labels written back onto the boxes.

Boxes are a reply's detections (daemon/pipeline/kinds/detect.py, `to_reply`): corners in the
sent image's pixels. A region is whole pixels `(left, top, right, bottom)`, right and bottom
exclusive (Pillow's crop box), inside the image and at least one pixel wide and high.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

Region = tuple[int, int, int, int]
SUB_LABEL, SUB_SCORE = "sub_label", "sub_score"


def chosen(detections: Sequence[dict], min_score: float, max_crops: int) -> list[int]:
    """Positions of the boxes to classify: those scoring at least `min_score`, highest first (the
    reply's order on a tie), at most `max_crops`."""
    passing = [i for i, d in enumerate(detections) if d["score"] >= min_score]
    passing.sort(key=lambda i: -detections[i]["score"])  # stable: ties keep the reply's order
    return passing[:max(max_crops, 0)]


def padded_region(box: dict, pad: float, width: int, height: int) -> Region:
    """A reply's box (its `box`: x_min, y_min, x_max, y_max) widened by `pad` times its own width on the left and on the right (its height
    above and below), out to whole pixels, clipped to the `width` x `height` image. A box that
    is empty or lies on the image's edge still yields one pixel."""
    x_min, y_min, x_max, y_max = box["x_min"], box["y_min"], box["x_max"], box["y_max"]
    grow_x, grow_y = pad * (x_max - x_min), pad * (y_max - y_min)
    left = _within(math.floor(x_min - grow_x), width - 1)
    top = _within(math.floor(y_min - grow_y), height - 1)
    right = max(_within(math.ceil(x_max + grow_x), width), left + 1)
    bottom = max(_within(math.ceil(y_max + grow_y), height), top + 1)
    return left, top, right, bottom


def _within(value: int, most: int) -> int:
    return min(max(value, 0), most)


def attach(detections: Sequence[dict], positions: Sequence[int], labels: Sequence[str],
           scores: Sequence[float]) -> None:
    """Every box gets `sub_label` and `sub_score`: the classifier's top-1 for the boxes at
    `positions` (in the same order as `labels` and `scores`), null for the others."""
    found: dict[int, tuple[Optional[str], Optional[float]]] = {
        i: (label, score) for i, label, score in zip(positions, labels, scores)}
    for i, d in enumerate(detections):
        d[SUB_LABEL], d[SUB_SCORE] = found.get(i, (None, None))
