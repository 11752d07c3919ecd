"""What validate reports per kind (daemon/pipeline/scoring.py), on small examples worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

from daemon.pipeline.kinds.detect import Box
from daemon.pipeline.scoring import detection_pr, mae, rmse, roc_auc, threshold_at_fpr
from tests.floats import SUBNORMALS

# --- roc_auc ------------------------------------------------------------------------------


@pytest.mark.parametrize("y, scores, expected", [
    ([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8], 0.75),     # 3 of the 4 pairs ordered right
    ([0, 0, 1, 1], [0.1, 0.2, 0.3, 0.4], 1.0),
    ([0, 0, 1, 1], [0.3, 0.4, 0.1, 0.2], 0.0),
    ([0, 1], [0.5, 0.5], 0.5),                       # a tie counts one half
    ([0, 0, 1, 1], [0.2, 0.5, 0.5, 0.9], 0.875),     # pairs 1 + 0.5 + 1 + 1 of 4
    ([1, 0, 0, 0], [0.3, 0.3, 0.3, 0.1], 4 / 6),     # ties of three: (1 + 0.5 + 0.5) / 3
])
def test_roc_auc(y, scores, expected):
    assert roc_auc(np.array(y), np.array(scores)) == pytest.approx(expected)


def test_roc_auc_takes_boolean_labels():
    assert roc_auc(np.array([False, True]), np.array([0.1, 0.9])) == 1.0


@pytest.mark.parametrize("y, scores, problem", [
    ([0, 0, 0], [0.1, 0.2, 0.3], "all 3 are normal"),
    ([1, 1], [0.1, 0.2], "all 2 are anomalous"),
    ([0, 2], [0.1, 0.2], "0 .normal. or 1"),
    ([0, 1], [0.1], "2 labels but 1 scores"),
    ([0, 1], [0.1, float("nan")], "NaN"),
])
def test_roc_auc_names_what_is_wrong(y, scores, problem):
    with pytest.raises(ValueError, match=problem):
        roc_auc(np.array(y), np.array(scores))


_labelled = st.lists(st.tuples(st.integers(0, 1), st.integers(0, 5)), min_size=2, max_size=30).filter(
    lambda rows: len({label for label, _ in rows}) == 2)


@given(_labelled)
def test_roc_auc_is_the_share_of_anomalous_normal_pairs_ordered_right(rows):
    y = np.array([label for label, _ in rows])
    scores = np.array([score for _, score in rows], dtype=float)
    pairs = [(p, n) for p in scores[y == 1] for n in scores[y == 0]]
    expected = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in pairs) / len(pairs)
    assert roc_auc(y, scores) == pytest.approx(expected)


# --- threshold_at_fpr ---------------------------------------------------------------------

Y = np.array([0, 0, 0, 0, 1, 1])
SCORES = np.array([0.1, 0.2, 0.3, 0.4, 0.35, 0.5])


@pytest.mark.parametrize("fpr, expected", [
    (0.25, (0.3, 0.25, 1.0)),       # one normal (0.4) above 0.3; both anomalies too
    (0.0, (0.4, 0.0, 0.5)),
    (0.1, (0.4, 0.0, 0.5)),         # a quarter is the smallest step: none allowed
    (0.5, (0.2, 0.5, 1.0)),
    (0.99, (0.1, 0.75, 1.0)),       # the lowest normal score: a lower threshold adds nothing the rule can see
])
def test_threshold_at_fpr(fpr, expected):
    assert threshold_at_fpr(Y, SCORES, fpr) == pytest.approx(expected)


def test_threshold_at_fpr_with_tied_normal_scores_may_achieve_less_than_allowed():
    y = np.array([0, 0, 0, 0, 1])
    # Allowing one false positive at 0.4 is impossible: below 0.4 both tied 0.4s become positives.
    assert threshold_at_fpr(y, np.array([0.2, 0.4, 0.4, 0.1, 0.3]), 0.25) == (0.4, 0.0, 0.0)


def test_threshold_at_fpr_counts_a_rate_that_is_not_exact_in_binary():
    y = np.r_[np.zeros(100, dtype=int), np.ones(3, dtype=int)]
    scores = np.r_[np.arange(100.0), [50.0, 80.0, 100.0]]
    # 29 of the 100 normals (71..99) lie above 70; floor(0.29 * 100) would be 28.
    assert threshold_at_fpr(y, scores, 0.29) == pytest.approx((70.0, 0.29, 2 / 3))


@pytest.mark.parametrize("fpr", [1.0, -0.1, 1.5])
def test_threshold_at_fpr_refuses_a_rate_outside_0_to_1(fpr):
    with pytest.raises(ValueError, match="fpr must be in"):
        threshold_at_fpr(Y, SCORES, fpr)


def test_threshold_at_fpr_needs_both_classes():
    with pytest.raises(ValueError, match="both normal and anomalous"):
        threshold_at_fpr(np.array([0, 0]), np.array([0.1, 0.2]), 0.1)


@given(_labelled, st.floats(0.0, 0.99, allow_subnormal=SUBNORMALS))
def test_threshold_at_fpr_is_the_smallest_threshold_within_the_rate(rows, fpr):
    y = np.array([label for label, _ in rows])
    scores = np.array([score for _, score in rows], dtype=float)
    threshold, achieved, _ = threshold_at_fpr(y, scores, fpr)
    normal = scores[y == 0]
    assert achieved == np.mean(normal > threshold) and achieved <= fpr
    lower = normal[normal < threshold]
    if lower.size:      # the next normal score down would let too many through
        assert np.mean(normal > lower.max()) > fpr


# --- mae, rmse ----------------------------------------------------------------------------

TRUTH = np.array([[1.0, 2.0], [3.0, 4.0]])
PRED = np.array([[2.0, 2.0], [3.0, 0.0]])       # errors 1, 0, 0, -4


def test_mae_and_rmse_over_all_elements():
    assert mae(TRUTH, PRED) == 1.25
    assert rmse(TRUTH, PRED) == pytest.approx(math.sqrt(17 / 4))


@pytest.mark.parametrize("metric", [mae, rmse])
def test_errors_refuse_mismatched_or_empty_arrays(metric):
    with pytest.raises(ValueError, match="differ in shape"):
        metric(TRUTH, PRED[0])
    with pytest.raises(ValueError, match="no values"):
        metric(np.empty(0), np.empty(0))


# --- detection_pr -------------------------------------------------------------------------

A = Box(0.1, 0.1, 0.3, 0.3)
NEAR_A = Box(0.1, 0.1, 0.3, 0.32)       # IoU 0.04 / 0.044 = 0.909 with A
B = Box(0.6, 0.6, 0.9, 0.9)
FAR = Box(0.0, 0.7, 0.1, 0.8)
C = Box(0.4, 0.0, 0.5, 0.1)


def test_detection_pr_counts_matches_duplicates_wrong_classes_misses_and_strays():
    predicted = [[(0, NEAR_A, 0.9), (0, A, 0.8), (1, FAR, 0.7), (1, A, 0.95)],   # 1 match, 3 false
                 [],
                 [(0, C, 0.6)]]                                                  # nothing there
    truth = [[(0, A), (1, B)], [(2, C)], []]
    assert detection_pr(predicted, truth) == pytest.approx(
        {"precision": 1 / 5, "recall": 1 / 3, "true_positives": 1, "false_positives": 4, "false_negatives": 2})


def _span(x0: float, x1: float) -> Box:
    return Box(x0 / 20, 0.0, x1 / 20, 1.0)


def test_detection_pr_matches_by_score_then_to_the_most_overlapping_truth():
    t1, t2 = _span(0, 10), _span(4, 14)
    best = (0, _span(1, 11), 0.9)       # IoU 9/11 with t1, 7/13 with t2: takes t1
    second = (0, _span(-2, 8), 0.5)     # IoU 8/12 with t1 (taken), 4/16 with t2: no match
    # Matching in list order, or to the first truth that fits, would find two.
    found = detection_pr([[second, best]], [[(0, t2), (0, t1)]])
    assert (found["true_positives"], found["false_positives"], found["false_negatives"]) == (1, 1, 1)


def test_detection_pr_uses_the_iou_given():
    near = [[(0, NEAR_A, 0.9)]]
    assert detection_pr(near, [[(0, A)]], iou=0.95)["true_positives"] == 0
    assert detection_pr(near, [[(0, A)]], iou=0.9)["true_positives"] == 1


def test_detection_pr_matches_an_overlap_of_exactly_the_iou():
    assert detection_pr([[(0, Box(0, 0, 1, 1), 0.9)]], [[(0, Box(0, 0, 2, 1))]])["true_positives"] == 1


def test_detection_pr_with_nothing_to_count_is_zero():
    assert detection_pr([[]], [[]]) == {"precision": 0.0, "recall": 0.0, "true_positives": 0,
                                        "false_positives": 0, "false_negatives": 0}


def test_detection_pr_needs_one_truth_per_image():
    with pytest.raises(ValueError, match="2 images but truth for 1"):
        detection_pr([[], []], [[]])
