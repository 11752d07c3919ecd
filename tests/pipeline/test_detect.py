"""Detection post-processing (daemon/pipeline/kinds/detect.py): SSD and YOLO decoding,
NMS and boxes mapped back to the sent image, against answers worked out by hand.

Box coordinates in the YOLO tensors are multiples of 1/32, so every corner is exact in float64
and results compare with ==."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

from daemon.pipeline.geometry import Geometry
from daemon.pipeline.kinds.detect import (
    DEFAULT_IOU, Box, Detection, iou, ious, nms, ssd, to_reply, yolo,
)

# --- SSD ----------------------------------------------------------------------------------

# ymin, xmin, ymax, xmax; row 1 strays outside [0, 1]; rows 3 and 4 lie past a count of 3.
SSD_BOXES = np.array([[0.1, 0.2, 0.5, 0.6],
                      [-0.05, 0.5, 0.4, 1.02],
                      [0.2, 0.2, 0.3, 0.3],
                      [0.0, 0.0, 1.0, 1.0],
                      [0.0, 0.0, 0.0, 0.0]])
SSD_CLASSES = np.array([0.0, 17.0, 2.0, 1.0, 0.0])
SSD_SCORES = np.array([0.6, 0.9, 0.3, 0.95, 0.0])
PERSON = Detection(0, 0.6, Box(0.2, 0.1, 0.6, 0.5))
CAT = Detection(17, 0.9, Box(0.5, 0.0, 1.0, 0.4))       # clamped into the input


@pytest.mark.parametrize("count", [np.float32(3.0), np.array([3.0])])
def test_ssd_keeps_counted_rows_above_min_score_best_first_and_clamped(count):
    assert ssd(SSD_BOXES, SSD_CLASSES, SSD_SCORES, count, min_score=0.5, max_results=10) == [CAT, PERSON]


def test_ssd_reads_rows_past_the_count_only_when_counted():
    found = ssd(SSD_BOXES, SSD_CLASSES, SSD_SCORES, np.array(5.0), min_score=0.5, max_results=10)
    assert found == [Detection(1, 0.95, Box(0.0, 0.0, 1.0, 1.0)), CAT, PERSON]


def test_ssd_filters_by_score_even_when_the_count_says_all_rows():
    found = ssd(SSD_BOXES, SSD_CLASSES, SSD_SCORES, np.array(5.0), min_score=0.0, max_results=10)
    assert [d.score for d in found] == [0.95, 0.9, 0.6, 0.3, 0.0]
    assert ssd(SSD_BOXES, SSD_CLASSES, SSD_SCORES, np.array(5.0), min_score=0.01, max_results=10)[-1].score == 0.3


def test_ssd_keeps_a_score_equal_to_min_score():
    assert ssd(SSD_BOXES, SSD_CLASSES, SSD_SCORES, np.array(3.0), min_score=0.6, max_results=10) == [CAT, PERSON]


def test_ssd_stops_at_max_results():
    assert ssd(SSD_BOXES, SSD_CLASSES, SSD_SCORES, np.array(3.0), min_score=0.5, max_results=1) == [CAT]
    assert ssd(SSD_BOXES, SSD_CLASSES, SSD_SCORES, np.array(3.0), min_score=0.5, max_results=0) == []


def test_ssd_with_a_count_of_zero_finds_nothing():
    assert ssd(SSD_BOXES, SSD_CLASSES, SSD_SCORES, np.array(0.0), min_score=0.0, max_results=10) == []


# --- YOLO ---------------------------------------------------------------------------------

# 8 anchors, 2 classes: cx, cy, w, h, score of class 0, score of class 1 (normalized).
ANCHORS = np.array([
    [0.375, 0.375, 0.25, 0.25, 0.9, 0.1],       # a: class 0, (0.25, 0.25)-(0.5, 0.5)
    [0.40625, 0.375, 0.25, 0.25, 0.8, 0.0],     # b: class 0, IoU 7/9 with a: suppressed
    [0.375, 0.375, 0.25, 0.25, 0.0, 0.7],       # c: class 1, a's box: kept (other class)
    [0.75, 0.625, 0.25, 0.5, 0.6, 0.2],         # d: class 0, apart from a
    [0.9375, 0.5, 0.25, 0.25, 0.1, 0.55],       # e: class 1, x_max 1.0625 clamped to 1
    [0.5, 0.375, 0.25, 0.25, 0.5, 0.0],         # f: class 0, IoU 1/3 with a: kept
    [0.5, 0.5, 0.125, 0.125, 0.05, 0.1],        # g, h: below min_score
    [0.25, 0.75, 0.125, 0.125, 0.1, 0.05],
])
EXPECTED = [
    Detection(0, 0.9, Box(0.25, 0.25, 0.5, 0.5)),
    Detection(1, 0.7, Box(0.25, 0.25, 0.5, 0.5)),
    Detection(0, 0.6, Box(0.625, 0.375, 0.875, 0.875)),
    Detection(1, 0.55, Box(0.8125, 0.375, 1.0, 0.625)),
    Detection(0, 0.5, Box(0.375, 0.25, 0.625, 0.5)),
]
INPUT = (640, 320)


def _in_pixels(anchors: np.ndarray) -> np.ndarray:
    width, height = INPUT
    return anchors * np.array([width, height, width, height, 1.0, 1.0])


@pytest.mark.parametrize("output", [ANCHORS.T, ANCHORS, _in_pixels(ANCHORS).T, _in_pixels(ANCHORS)],
                         ids=["features-first", "anchors-first", "pixels-features-first", "pixels-anchors-first"])
def test_yolo_decodes_both_layouts_and_both_coordinate_conventions(output):
    assert yolo(output, min_score=0.25, max_results=10, input_size=INPUT) == EXPECTED


def test_yolo_reads_a_square_output_as_features_first():
    square = ANCHORS[:6].T       # 6 values (4 + 2 classes) for each of 6 anchors, a..f
    assert yolo(square, min_score=0.25, max_results=10, input_size=INPUT) == EXPECTED


def test_yolo_honours_min_score_and_max_results():
    assert yolo(ANCHORS.T, min_score=0.55, max_results=10, input_size=INPUT) == EXPECTED[:4]
    assert yolo(ANCHORS.T, min_score=0.25, max_results=2, input_size=INPUT) == EXPECTED[:2]


def test_yolo_keeps_a_same_class_overlap_below_the_iou_threshold():
    found = yolo(ANCHORS.T, min_score=0.25, max_results=10, input_size=INPUT, iou=0.8)
    assert Detection(0, 0.8, Box(0.28125, 0.25, 0.53125, 0.5)) in found
    assert len(found) == len(EXPECTED) + 1


def test_yolo_with_nothing_above_min_score_finds_nothing():
    assert yolo(ANCHORS.T, min_score=0.95, max_results=10, input_size=INPUT) == []


@pytest.mark.parametrize("shape", [(1, 6, 8), (4, 8), (8,)])
def test_yolo_refuses_an_output_that_is_not_boxes_and_classes(shape):
    with pytest.raises(ValueError, match="YOLO output"):
        yolo(np.zeros(shape), min_score=0.25, max_results=10, input_size=INPUT)


# --- NMS and IoU --------------------------------------------------------------------------


def test_nms_keeps_the_best_of_overlapping_boxes_and_boxes_apart():
    boxes = np.array([[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30], [0, 0, 10, 10]], dtype=float)
    # Box 1 wins; 0 and 3 overlap it by IoU 81/119; box 2 is apart.
    assert nms(boxes, np.array([0.8, 0.9, 0.7, 0.8]), DEFAULT_IOU).tolist() == [1, 2]


def test_nms_drops_only_overlaps_above_the_threshold():
    boxes = np.array([[0, 0, 2, 1], [1, 0, 3, 1]], dtype=float)        # IoU exactly 1/3
    assert nms(boxes, np.array([0.9, 0.8]), 1 / 3).tolist() == [0, 1]
    assert nms(boxes, np.array([0.9, 0.8]), 0.3).tolist() == [0]


def test_nms_of_nothing_is_nothing():
    assert nms(np.empty((0, 4)), np.empty(0), DEFAULT_IOU).tolist() == []


@pytest.mark.parametrize("a, b, expected", [
    (Box(0, 0, 2, 2), Box(1, 1, 3, 3), 1 / 7),
    (Box(0, 0, 1, 1), Box(0, 0, 1, 1), 1.0),
    (Box(0, 0, 1, 1), Box(2, 2, 3, 3), 0.0),
    (Box(0, 0, 1, 1), Box(1, 0, 2, 1), 0.0),          # touching edges
    (Box(0, 0, 0, 0), Box(0, 0, 0, 0), 0.0),          # both empty
])
def test_iou(a, b, expected):
    assert iou(a, b) == pytest.approx(expected)


_coord = st.integers(0, 20)
_boxes = st.lists(st.tuples(_coord, _coord, st.integers(1, 10), st.integers(1, 10), st.integers(0, 5)),
                  max_size=12)


@given(_boxes, st.sampled_from([0.1, 0.3, 0.45, 0.7]))
def test_nms_is_greedy_suppression(rows, threshold):
    """Kept boxes overlap each other at most `threshold`; each dropped box overlaps a kept one
    that scores at least as high by more."""
    boxes = np.array([[x, y, x + w, y + h] for x, y, w, h, _ in rows], dtype=float).reshape(-1, 4)
    scores = np.array([s for *_, s in rows], dtype=float)
    kept = nms(boxes, scores, threshold).tolist()
    as_box = [Box(*b) for b in boxes.tolist()]
    assert all(iou(as_box[i], as_box[j]) <= threshold for i in kept for j in kept if i != j)
    for dropped in set(range(len(rows))) - set(kept):
        assert any(iou(as_box[dropped], as_box[k]) > threshold and scores[k] >= scores[dropped] for k in kept)
    assert [scores[k] for k in kept] == sorted((scores[k] for k in kept), reverse=True)


# --- to_reply -----------------------------------------------------------------------------

LABELS = {0: "person", 17: "cat"}


def test_to_reply_maps_boxes_through_a_stretch():
    stretch = Geometry(640, 480, 300, 300, 300 / 640, 300 / 480)
    detections = [Detection(17, 0.87654321, Box(0.25, 0.5, 0.75, 1.0)),
                  Detection(0, 0.5, Box(0.1234, 0.0, 1.0, 0.25))]
    assert to_reply(detections, LABELS.__getitem__, stretch) == [
        {"label": "cat", "index": 17, "score": 0.876543,
         "box": {"x_min": 160.0, "y_min": 240.0, "x_max": 480.0, "y_max": 480.0}},
        # 0.1234 * 300 / (300 / 640) = 78.976
        {"label": "person", "index": 0, "score": 0.5,
         "box": {"x_min": 79.0, "y_min": 0.0, "x_max": 640.0, "y_max": 120.0}},
    ]


def test_to_reply_maps_boxes_through_a_letterbox_and_clamps_the_padding():
    letterbox = Geometry(640, 480, 320, 320, 0.5, 0.5, pad_y=40.0)
    detections = [Detection(0, 0.9, Box(0.25, 0.25, 0.75, 0.75)),
                  Detection(0, 0.8, Box(0.0, 0.0, 1.0, 1.0))]
    boxes = [r["box"] for r in to_reply(detections, LABELS.__getitem__, letterbox)]
    # y: (0.25 * 320 - 40) / 0.5 = 80, (0.75 * 320 - 40) / 0.5 = 400; the padding rows fall off the image.
    assert boxes == [{"x_min": 160.0, "y_min": 80.0, "x_max": 480.0, "y_max": 400.0},
                     {"x_min": 0.0, "y_min": 0.0, "x_max": 640.0, "y_max": 480.0}]


def test_to_reply_maps_keypoints_like_the_box_and_only_when_there_are_some():
    letterbox = Geometry(640, 480, 320, 320, 0.5, 0.5, pad_y=40.0)
    eyes = Detection(0, 0.9, Box(0.25, 0.25, 0.75, 0.75), keypoints=((0.375, 0.375), (0.625, 0.375), (0.5, 0.0625)))
    reply = to_reply([eyes, Detection(0, 0.8, Box(0.0, 0.0, 1.0, 1.0))], LABELS.__getitem__, letterbox)
    # x: 0.375 * 320 / 0.5 = 240; y: (0.375 * 320 - 40) / 0.5 = 160; y of 0.0625 falls in the padding: 0.
    assert reply[0]["keypoints"] == [[240.0, 160.0], [400.0, 160.0], [320.0, 0.0]]
    assert "keypoints" not in reply[1]


def test_nms_stops_at_its_limit_as_the_greedy_pass_would_have_kept_them():
    boxes = np.array([[0.0, 0.0, 0.5, 0.5], [0.0, 0.0, 0.5, 0.5], [0.5, 0.5, 1.0, 1.0], [0.0, 0.5, 0.5, 1.0]])
    scores = np.array([0.9, 0.8, 0.7, 0.6])
    assert nms(boxes, scores, 0.5).tolist() == [0, 2, 3]
    assert nms(boxes, scores, 0.5, limit=2).tolist() == [0, 2]
    assert nms(boxes, scores, 0.5, limit=0).tolist() == []


def test_ious_of_one_box_with_many():
    box = np.array([0.0, 0.0, 0.5, 0.5])
    others = np.array([[0.0, 0.0, 0.5, 0.5], [0.25, 0.0, 0.75, 0.5], [0.5, 0.5, 1.0, 1.0], [0.2, 0.2, 0.2, 0.2]])
    # Half of each box overlaps: 0.125 / (0.25 + 0.25 - 0.125) = 1/3; a corner touch and an empty box: 0.
    assert ious(box, others).tolist() == [1.0, 1 / 3, 0.0, 0.0]


def test_to_reply_of_nothing_is_an_empty_list():
    assert to_reply([], LABELS.__getitem__, Geometry.identity(300, 300)) == []
