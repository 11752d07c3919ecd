"""Non-maximum suppression of decoded anchor boxes, as MediaPipe's NonMaxSuppressionCalculator
(non_max_suppression_calculator.cc) does it with IoU overlap, across classes.

- **hard** (its DEFAULT algorithm): boxes in score order; one overlapping a kept box by IoU
  above the threshold is dropped. The same greedy pass as YOLO's (`detect.nms`).
- **weighted** (WEIGHTED, what its face, palm and pose detectors use): the best remaining box
  and every remaining box overlapping it by IoU above the threshold (itself included) form a
  cluster; the cluster's box and keypoints are their score-weighted means, its score and
  class the best box's; the cluster leaves, and so on. Smoother boxes than hard NMS where a
  face lights up several neighbouring anchors.

Both work on xyxy boxes normalized to the model input and return clusters best first.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from daemon.config.anchors import WEIGHTED, NmsOptions
from daemon.pipeline.kinds.detect import ious, nms as hard_nms

Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def suppress(boxes: np.ndarray, keypoints: np.ndarray, scores: np.ndarray, classes: np.ndarray,
             options: NmsOptions) -> Arrays:
    """(boxes [K, 4], keypoints [K, P, 2], scores [K], classes [K]) after `options`' NMS, best
    first, at most `options.max_detections`."""
    if options.mode == WEIGHTED:
        return weighted_nms(boxes, keypoints, scores, classes, options.iou, options.max_detections)
    kept = hard_nms(boxes, scores, options.iou, options.max_detections)
    return boxes[kept], keypoints[kept], scores[kept], classes[kept]


def weighted_nms(boxes: np.ndarray, keypoints: np.ndarray, scores: np.ndarray, classes: np.ndarray,
                 iou: float, limit: Optional[int] = None) -> Arrays:
    """MediaPipe's WeightedNonMaxSuppression: one detection per cluster, best first, at most
    `limit` (None: all; MediaPipe's weighted pass has no limit, and stopping early changes none
    of the clusters before)."""
    order = np.argsort(-scores, kind="stable")  # equal scores: anchor order (std::sort leaves it open)
    leaders, merged_boxes, merged_points = [], [], []
    while order.size and (limit is None or len(leaders) < limit):
        best = order[0]
        joins = ious(boxes[best], boxes[order]) > iou
        # The best box is its own cluster's member even where its IoU with itself is not above
        # the threshold (an empty box, or iou >= 1): MediaPipe would keep it and stop there.
        joins[0] = True
        members = order[joins]
        box, points = _weighted_mean(boxes[members], keypoints[members], scores[members])
        leaders.append(best)
        merged_boxes.append(box if box is not None else boxes[best])
        merged_points.append(points if points is not None else keypoints[best])
        order = order[~joins]
    kept = np.array(leaders, dtype=np.intp)
    if not leaders:
        return boxes[kept], keypoints[kept], scores[kept], classes[kept]
    return (np.stack(merged_boxes).astype(boxes.dtype), np.stack(merged_points).astype(keypoints.dtype),
            scores[kept], classes[kept])


def _weighted_mean(boxes: np.ndarray, keypoints: np.ndarray,
                   weights: np.ndarray) -> tuple[Optional[np.ndarray], Optional[np.ndarray]]:
    """The score-weighted mean box and keypoints of a cluster; (None, None), the best box as it
    is, for a cluster of one (its mean is itself, but for rounding) or whose scores sum to 0 or
    less (raw scores without a sigmoid can), where MediaPipe would divide by zero."""
    weights = weights.astype(np.float64)
    total = weights.sum()
    if len(weights) == 1 or not total > 0:
        return None, None
    box = (weights[:, None] * boxes).sum(axis=0) / total
    points = (weights[:, None, None] * keypoints).sum(axis=0) / total
    return box, points
