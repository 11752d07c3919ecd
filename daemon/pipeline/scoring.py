"""What `edge-inferd validate` reports per output kind, in plain numpy.

- anomaly: `roc_auc` of the scores against 0 (normal) / 1 (anomalous) labels, and
  `threshold_at_fpr`, the operating point a route's `threshold:` can be set to;
- regression: `mae` and `rmse` over all values;
- detection: `detection_pr`, precision and recall at one IoU, matched greedily by score.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from daemon.pipeline.kinds.detect import Box, iou as box_iou

NORMAL, ANOMALOUS = 0, 1
DEFAULT_MATCH_IOU = 0.5
"""PASCAL VOC's match rule: a prediction counts when it overlaps its truth box by IoU >= 0.5."""


def _labelled(y: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """y as booleans (True = anomalous) and scores as float64, both classes present."""
    y, scores = np.asarray(y).reshape(-1), np.asarray(scores, dtype=np.float64).reshape(-1)
    if y.shape != scores.shape:
        raise ValueError(f"{y.size} labels but {scores.size} scores")
    if not np.isin(y, (NORMAL, ANOMALOUS)).all():
        raise ValueError("labels must be 0 (normal) or 1 (anomalous)")
    if np.isnan(scores).any():
        raise ValueError("scores hold NaN")
    anomalous = y == ANOMALOUS
    if anomalous.all() or not anomalous.any():
        only = "anomalous (1)" if anomalous.any() else "normal (0)"
        raise ValueError(f"needs both normal and anomalous rows: all {y.size} are {only}")
    return anomalous, scores


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, tied values sharing the mean of the ranks they span."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts_group = np.r_[True, ordered[1:] != ordered[:-1]]
    starts = np.flatnonzero(starts_group)
    ends = np.r_[starts[1:], len(values)]
    ranks = np.empty(len(values), dtype=np.float64)
    # A group at sorted positions start..end-1 holds ranks start+1..end, whose mean is this.
    ranks[order] = ((starts + 1 + ends) / 2.0)[np.cumsum(starts_group) - 1]
    return ranks


def roc_auc(y: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve: the chance an anomalous row outscores a normal one, a tie
    counting one half (Mann-Whitney U from average ranks)."""
    anomalous, scores = _labelled(y, scores)
    positives, negatives = int(anomalous.sum()), int((~anomalous).sum())
    rank_sum = _average_ranks(scores)[anomalous].sum()
    return float((rank_sum - positives * (positives + 1) / 2.0) / (positives * negatives))


def threshold_at_fpr(y: np.ndarray, scores: np.ndarray, fpr: float) -> tuple[float, float, float]:
    """(threshold, achieved false-positive rate, true-positive rate) for the rule `score > threshold`:
    the smallest threshold whose false-positive rate on the normal rows is at most `fpr`.
    The threshold is always one of the normal rows' scores (the rate only drops there)."""
    if not 0.0 <= fpr < 1.0:
        raise ValueError(f"fpr must be in [0, 1), not {fpr}")
    anomalous, scores = _labelled(y, scores)
    normal = np.sort(scores[~anomalous])
    candidates = np.unique(normal)
    # Compared as counts / n, as the achieved rate is reported: 29/100 <= 0.29 holds exactly,
    # where floor(0.29 * 100) would allow only 28.
    rates = (normal.size - np.searchsorted(normal, candidates, side="right")) / normal.size
    threshold = float(candidates[np.flatnonzero(rates <= fpr)[0]])
    achieved = float(np.mean(normal > threshold))
    return threshold, achieved, float(np.mean(scores[anomalous] > threshold))


def _pair(y: np.ndarray, pred: np.ndarray) -> np.ndarray:
    y, pred = np.asarray(y, dtype=np.float64), np.asarray(pred, dtype=np.float64)
    if y.shape != pred.shape:
        raise ValueError(f"truth {y.shape} and predictions {pred.shape} differ in shape")
    if not y.size:
        raise ValueError("no values to compare")
    return pred - y


def mae(y: np.ndarray, pred: np.ndarray) -> float:
    """Mean absolute error over all elements."""
    return float(np.mean(np.abs(_pair(y, pred))))


def rmse(y: np.ndarray, pred: np.ndarray) -> float:
    """Root mean squared error over all elements."""
    error = _pair(y, pred)
    return float(np.sqrt(np.mean(error * error)))


def _match_image(predicted: Sequence[tuple[int, Box, float]], truth: Sequence[tuple[int, Box]],
                 iou: float) -> int:
    """True positives in one image: each prediction, best score first, takes the unmatched
    truth box of its class it overlaps most, if that overlap reaches `iou`."""
    unmatched = list(range(len(truth)))
    hits = 0
    for index, box, _ in sorted(predicted, key=lambda p: -p[2]):
        overlaps = [(box_iou(box, truth[t][1]), t) for t in unmatched if truth[t][0] == index]
        best = max(overlaps, default=None, key=lambda o: o[0])
        if best is not None and best[0] >= iou:
            unmatched.remove(best[1])
            hits += 1
    return hits


def detection_pr(predicted: Sequence[Sequence[tuple[int, Box, float]]],
                 truth: Sequence[Sequence[tuple[int, Box]]], iou: float = DEFAULT_MATCH_IOU) -> dict:
    """Precision and recall over all images: predictions are (class, box, score), truths (class, box),
    one sequence per image. A rate with nothing to count (no predictions, or no truths) is 0.0."""
    if len(predicted) != len(truth):
        raise ValueError(f"predictions for {len(predicted)} images but truth for {len(truth)}")
    true_positives = sum(_match_image(p, t, iou) for p, t in zip(predicted, truth))
    false_positives = sum(len(p) for p in predicted) - true_positives
    false_negatives = sum(len(t) for t in truth) - true_positives
    return {"precision": _rate(true_positives, true_positives + false_positives),
            "recall": _rate(true_positives, true_positives + false_negatives),
            "true_positives": true_positives, "false_positives": false_positives,
            "false_negatives": false_negatives}


def _rate(part: int, whole: int) -> float:
    return part / whole if whole else 0.0
