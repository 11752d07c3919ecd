"""Raw SSD heads decoded as MediaPipe does (daemon/pipeline/kinds/anchors.py and nms.py).

Every expected value is worked out here from the C++ formulas (ssd_anchors_calculator.cc,
tensors_to_detections_calculator.cc, non_max_suppression_calculator.cc), in float32 where the
C++ computes in float, or is a multiple of a power of two, exact in float32, so most results
compare with ==. The anchor layouts are the ones MediaPipe's graphs and tests use: BlazeFace
short range (face_detection_short_range_common.pbtxt), full range
(face_detection_full_range_common.pbtxt) and the SSD MobileNet of ssd_anchors_calculator_test.cc.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from PIL import Image

from daemon.config.anchors import (HARD, WEIGHTED, AnchorDecode, AnchorOptions, NmsOptions, expected_boxes,
                                   find_outputs)
from daemon.pipeline.kinds.anchors import decode, detections, ssd_anchors
from daemon.pipeline.kinds.detect import ious
from daemon.pipeline.kinds.nms import suppress, weighted_nms
from tests.real_models import real_model

F32 = np.float32
SHORT_RANGE = AnchorOptions(num_layers=4, min_scale=0.1484375, max_scale=0.75, input_size_height=128,
                            input_size_width=128, strides=(8, 16, 16, 16), aspect_ratios=(1.0,),
                            fixed_anchor_size=True)
FULL_RANGE = AnchorOptions(num_layers=1, min_scale=0.1484375, max_scale=0.75, input_size_height=192,
                           input_size_width=192, strides=(4,), aspect_ratios=(1.0,),
                           interpolated_scale_aspect_ratio=0.0, fixed_anchor_size=True)
MOBILENET = AnchorOptions(num_layers=6, min_scale=0.2, max_scale=0.95, input_size_height=300, input_size_width=300,
                          strides=(16, 32, 64, 128, 256, 512), aspect_ratios=(1.0, 2.0, 0.5, 3.0, 0.3333),
                          reduce_boxes_in_lowest_layer=True)
BLAZEFACE = AnchorDecode(anchors=SHORT_RANGE, num_classes=1, num_boxes=896, num_coords=16, box_coord_offset=0,
                         keypoint_coord_offset=4, num_keypoints=6, num_values_per_keypoint=2, x_scale=128.0,
                         y_scale=128.0, w_scale=128.0, h_scale=128.0, reverse_output_order=True, sigmoid_score=True,
                         score_clipping_thresh=100.0, min_score_thresh=0.5, nms=NmsOptions(0.3, None, WEIGHTED))
FIRST_16_GRID = 16 * 16 * 2  # short range: the stride-8 layer's anchors come first (16 x 16 cells, 2 each)
SHORT_RANGE_16_PER_CELL = 6  # the three stride-16 layers share a grid: 2 anchors each, per cell


def _scale(low: float, high: float, layer: int, layers: int) -> F32:
    """CalculateScale as the C++ writes it: a float difference, then double arithmetic, back to float."""
    return F32(float(F32(low)) + float(F32(high) - F32(low)) * layer / (layers - 1.0))


# --- anchors ------------------------------------------------------------------------------

@pytest.mark.parametrize("options, count", [
    (SHORT_RANGE, 16 * 16 * 2 + 8 * 8 * 3 * 2),   # 512 + 384: the stride-16 layers share one 8 x 8 grid
    (FULL_RANGE, 48 * 48 * 1),                     # one 48 x 48 grid, one anchor (no interpolated one)
    # 19 x 19 cells x 3 fixed boxes, then 5 ratios + 1 interpolated on 10x10, 5x5, 3x3, 2x2, 1x1 (ceil(300 / s))
    (MOBILENET, 19 * 19 * 3 + 6 * (10 * 10 + 5 * 5 + 3 * 3 + 2 * 2 + 1 * 1)),
])
def test_the_anchor_counts_of_mediapipes_layouts(options, count):
    assert count in (896, 2304, 1917)  # what MediaPipe's graphs give as num_boxes
    assert expected_boxes(options) == count
    assert ssd_anchors(options).shape == (count, 4) and ssd_anchors(options).dtype == F32


def test_short_range_anchors_are_centred_in_their_cells_and_sized_one():
    a = ssd_anchors(SHORT_RANGE)
    # Stride 8: 16 cells a side; two anchors per cell (aspect 1.0, then the interpolated one).
    assert a[0].tolist() == a[1].tolist() == [0.5 / 16, 0.5 / 16, 1.0, 1.0]
    assert a[2].tolist() == [1.5 / 16, 0.5 / 16, 1.0, 1.0]      # x moves first
    assert a[2 * 16].tolist() == [0.5 / 16, 1.5 / 16, 1.0, 1.0]  # a row down after 16 cells
    assert a[FIRST_16_GRID - 1].tolist() == [15.5 / 16, 15.5 / 16, 1.0, 1.0]
    # Stride 16: 8 cells a side, the three layers' two anchors each in one cell.
    cell = a[FIRST_16_GRID:FIRST_16_GRID + SHORT_RANGE_16_PER_CELL]
    assert cell.tolist() == [[0.5 / 8, 0.5 / 8, 1.0, 1.0]] * SHORT_RANGE_16_PER_CELL
    assert a[FIRST_16_GRID + SHORT_RANGE_16_PER_CELL].tolist() == [1.5 / 8, 0.5 / 8, 1.0, 1.0]
    assert a[-1].tolist() == [7.5 / 8, 7.5 / 8, 1.0, 1.0]


def test_mobilenet_anchors_follow_the_cc_formulas():
    a = ssd_anchors(MOBILENET)
    centre = F32(0.5) / F32(19)
    root2, root_half = np.sqrt(F32(2.0)), np.sqrt(F32(0.5))
    scale0 = _scale(0.2, 0.95, 0, 6)
    assert scale0 == F32(0.2)
    # The lowest layer's three fixed boxes: ratio 1 at scale 0.1, ratios 2 and 0.5 at the layer's scale.
    assert a[0].tolist() == [centre, centre, F32(0.1), F32(0.1)]
    assert a[1].tolist() == [centre, centre, scale0 * root2, scale0 / root2]
    assert a[2].tolist() == [centre, centre, scale0 * root_half, scale0 / root_half]
    assert a[3].tolist() == [F32(1.5) / F32(19), centre, F32(0.1), F32(0.1)]
    # Layer 1 (stride 32, 10 cells): the five ratios, then sqrt(scale_1 x scale_2) at ratio 1.
    first = 19 * 19 * 3
    scale1, scale2 = _scale(0.2, 0.95, 1, 6), _scale(0.2, 0.95, 2, 6)
    assert scale1 == pytest.approx(0.35) and scale2 == pytest.approx(0.5)
    ratios = [F32(r) for r in (1.0, 2.0, 0.5, 3.0, 0.3333)]
    expected = [[F32(0.05), F32(0.05), scale1 * np.sqrt(r), scale1 / np.sqrt(r)] for r in ratios]
    expected.append([F32(0.05), F32(0.05), np.sqrt(scale1 * scale2), np.sqrt(scale1 * scale2)])
    assert a[first:first + 6].tolist() == expected
    # The last layer (1 cell) interpolates towards a next scale of 1.0.
    assert a[-1].tolist() == [0.5, 0.5, np.sqrt(F32(0.95) * F32(1.0)), np.sqrt(F32(0.95) * F32(1.0))]
    assert a[-6][2] == a[-6][3] == _scale(0.2, 0.95, 5, 6) == F32(0.95)


def test_one_layer_takes_the_mean_of_min_and_max_scale():
    one = dataclasses.replace(FULL_RANGE, fixed_anchor_size=False)
    centre = F32(0.5) / F32(48)
    assert ssd_anchors(one)[0].tolist() == [centre, centre, (0.1484375 + 0.75) / 2, (0.1484375 + 0.75) / 2]


def test_equal_strides_share_a_grid_only_when_consecutive():
    apart = AnchorOptions(num_layers=3, min_scale=0.25, max_scale=0.75, input_size_height=64, input_size_width=64,
                          strides=(16, 32, 16), fixed_anchor_size=True)
    # Three grids of 4x4, 2x2 and 4x4 cells, two anchors per cell each: not one shared 4x4 grid.
    assert expected_boxes(apart) == len(ssd_anchors(apart)) == (16 + 4 + 16) * 2
    assert ssd_anchors(apart)[-1].tolist() == [3.5 / 4, 3.5 / 4, 1.0, 1.0]


def test_a_non_square_input_has_a_grid_of_its_own_shape_row_by_row():
    wide = AnchorOptions(num_layers=1, min_scale=0.5, max_scale=0.5, input_size_height=64, input_size_width=128,
                         strides=(32,), interpolated_scale_aspect_ratio=0.0, anchor_offset_x=0.0,
                         anchor_offset_y=0.25, fixed_anchor_size=True)
    centres = ssd_anchors(wide)[:, :2].tolist()
    # 2 rows of 4 cells; offsets 0 and 0.25 of a cell.
    assert centres == [[x / 4, (y + 0.25) / 2] for y in range(2) for x in range(4)]


def test_anchors_are_computed_once_per_options_and_read_only():
    assert ssd_anchors(SHORT_RANGE) is ssd_anchors(dataclasses.replace(SHORT_RANGE))
    with pytest.raises(ValueError):
        ssd_anchors(SHORT_RANGE)[0, 0] = 1.0


anchor_options = st.builds(
    lambda layers, strides, ratios, reduce, interpolated, fixed, size: AnchorOptions(
        num_layers=layers, min_scale=0.1, max_scale=0.9, input_size_height=size[0], input_size_width=size[1],
        strides=tuple(strides[:layers]), aspect_ratios=tuple(ratios), reduce_boxes_in_lowest_layer=reduce,
        interpolated_scale_aspect_ratio=interpolated, fixed_anchor_size=fixed),
    st.integers(1, 5), st.lists(st.sampled_from([4, 8, 16, 32, 64]), min_size=5, max_size=5),
    st.lists(st.sampled_from([1.0, 2.0, 0.5, 3.0]), min_size=1, max_size=4), st.booleans(),
    st.sampled_from([0.0, 1.0, 2.0]), st.booleans(), st.tuples(st.integers(16, 200), st.integers(16, 200)))


@settings(max_examples=60, deadline=None)
@given(anchor_options)
def test_the_count_check_config_uses_is_the_anchors_generated(options):
    anchors = ssd_anchors(options)
    assert len(anchors) == expected_boxes(options)
    assert np.all((anchors[:, :2] > 0) & (anchors[:, :2] < 1)) and np.all(anchors[:, 2:] > 0)


# --- decode -------------------------------------------------------------------------------

# A stride-16 cell of short range: row 3, column 5, its first anchor, centred at (5.5 / 8, 3.5 / 8).
CELL_ANCHOR = FIRST_16_GRID + (3 * 8 + 5) * SHORT_RANGE_16_PER_CELL
CENTRE_X, CENTRE_Y = 5.5 / 8, 3.5 / 8


def _heads(options: AnchorDecode, rows: dict[int, list[float]], logits: dict[int, list[float]],
           background: float = -10.0) -> tuple[np.ndarray, np.ndarray]:
    """Model-shaped box and score outputs: zeros and `background` logits but for the given anchors."""
    boxes = np.zeros((1, options.num_boxes, options.num_coords), dtype=F32)
    scores = np.full((1, options.num_boxes, options.num_classes), background, dtype=F32)
    for i, row in rows.items():
        boxes[0, i, :len(row)] = row
    for i, row in logits.items():
        scores[0, i] = row
    return boxes, scores


def _offsets(dx: float, dy: float, w: float, h: float, points: list[tuple[float, float]], reverse: bool) -> list:
    """A BlazeFace row in input pixels: x, y, w, h and x, y keypoints (reverse_output_order), or
    y, x, h, w and y, x ones."""
    box = [dx, dy, w, h] if reverse else [dy, dx, h, w]
    return box + [v for x, y in points for v in ((x, y) if reverse else (y, x))]


@pytest.mark.parametrize("reverse", [True, False])
def test_a_box_at_a_known_anchor_comes_back_where_its_offsets_put_it(reverse):
    options = dataclasses.replace(BLAZEFACE, reverse_output_order=reverse)
    # 16 px right, 8 px up, 64 x 32 px, of a 128 px input whose anchors are 1 x 1: /128 each.
    points = [(-16.0, 8.0), (0.0, 0.0), (32.0, -32.0), (0.0, 0.0), (0.0, 0.0), (0.0, 0.0)]
    boxes, scores = _heads(options, {CELL_ANCHOR: _offsets(16.0, -8.0, 64.0, 32.0, points, reverse)},
                           {CELL_ANCHOR: [5.0]})
    found, keypoints, found_scores, classes = decode(boxes, scores, ssd_anchors(SHORT_RANGE), options)
    cx, cy = CENTRE_X + 16 / 128, CENTRE_Y - 8 / 128
    assert found.tolist() == [[cx - 0.25, cy - 0.125, cx + 0.25, cy + 0.125]]
    assert keypoints.tolist() == [[[CENTRE_X - 0.125, CENTRE_Y + 0.0625], [CENTRE_X, CENTRE_Y],
                                   [CENTRE_X + 0.25, CENTRE_Y - 0.25]] + [[CENTRE_X, CENTRE_Y]] * 3]
    assert found_scores.tolist() == [F32(1) / (F32(1) + np.exp(F32(-5.0)))] and classes.tolist() == [0]


def test_the_exponential_box_size_scales_the_anchors_own_size():
    options = AnchorDecode(anchors=MOBILENET, num_classes=1, num_boxes=1917, num_coords=4, x_scale=10.0,
                           y_scale=10.0, w_scale=5.0, h_scale=5.0, apply_exponential_on_box_size=True)
    anchors = ssd_anchors(MOBILENET)
    ax, ay, aw, ah = (float(v) for v in anchors[1])  # 0.2 * sqrt(2) wide, 0.2 / sqrt(2) high
    # y, x, h, w: centre moved by 1/10 of the anchor's height down and 2/10 of its width right;
    # height exp(5 ln 2 / 5) = 2 x the anchor's, width exp(-5 ln 2 / 5) = half of it.
    row = [1.0, 2.0, 5 * np.log(2.0), -5 * np.log(2.0)]
    boxes, scores = _heads(options, {1: row}, {1: [0.9]}, background=0.0)
    options = dataclasses.replace(options, min_score_thresh=0.5)
    found, _, _, _ = decode(boxes, scores, anchors, options)
    cx, cy, w, h = ax + 0.2 * aw, ay + 0.1 * ah, aw / 2, ah * 2
    np.testing.assert_allclose(found, [[cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]], atol=1e-6)
    linear = dataclasses.replace(options, apply_exponential_on_box_size=False)
    found, _, _, _ = decode(boxes, scores, anchors, linear)
    w, h = -np.log(2.0) * aw, np.log(2.0) * ah  # a negative width: MediaPipe drops the box
    assert w < 0 and len(found) == 0


box_in_input = st.tuples(st.floats(0.05, 0.95), st.floats(0.05, 0.95), st.floats(0.02, 0.6), st.floats(0.02, 0.6))


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 1916), box_in_input, st.booleans(), st.booleans())
def test_offsets_encoded_against_any_anchor_decode_back_to_the_box(index, box, reverse, exponential):
    options = AnchorDecode(anchors=MOBILENET, num_classes=2, num_boxes=1917, num_coords=4, x_scale=10.0,
                           y_scale=10.0, w_scale=5.0, h_scale=5.0, reverse_output_order=reverse,
                           apply_exponential_on_box_size=exponential, min_score_thresh=0.5)
    ax, ay, aw, ah = (float(v) for v in ssd_anchors(MOBILENET)[index])
    cx, cy, w, h = box
    size = (np.log(w / aw) * 5, np.log(h / ah) * 5) if exponential else (w / aw * 5, h / ah * 5)
    dx, dy = (cx - ax) / aw * 10, (cy - ay) / ah * 10
    row = [dx, dy, size[0], size[1]] if reverse else [dy, dx, size[1], size[0]]
    boxes, scores = _heads(options, {index: row}, {index: [0.1, 0.9]}, background=0.0)
    found, _, _, classes = decode(boxes, scores, ssd_anchors(MOBILENET), options)
    assert classes.tolist() == [1]
    assert found[0].tolist() == pytest.approx([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], abs=2e-5)


def test_a_box_with_a_nan_offset_is_dropped():
    boxes, scores = _heads(BLAZEFACE, {CELL_ANCHOR: [np.nan, 0.0, 10.0, 10.0]}, {CELL_ANCHOR: [5.0]})
    assert len(decode(boxes, scores, ssd_anchors(SHORT_RANGE), BLAZEFACE)[0]) == 0


def test_the_heads_must_have_num_boxes_rows():
    boxes, scores = _heads(BLAZEFACE, {}, {})
    with pytest.raises(ValueError, match="the box output holds 14320 values, not 896 x 16"):
        decode(boxes[:, :895], scores, ssd_anchors(SHORT_RANGE), BLAZEFACE)
    with pytest.raises(ValueError, match="896 boxes need as many anchors, got 2304"):
        decode(boxes, scores, ssd_anchors(FULL_RANGE), BLAZEFACE)


# --- scores -------------------------------------------------------------------------------

def _scores(options: AnchorDecode, logits: list[list[float]]) -> tuple[list, list]:
    rows = {i: [0.0, 0.0, 8.0, 8.0] for i in range(len(logits))}
    boxes, scores = _heads(options, rows, dict(enumerate(logits)))
    _, _, found, classes = decode(boxes[:, :len(logits)], scores[:, :len(logits)],
                                  ssd_anchors(options.anchors)[:len(logits)],
                                  dataclasses.replace(options, num_boxes=len(logits)))
    return found.tolist(), classes.tolist()


def _sigmoid(x: float) -> F32:
    return F32(1) / (F32(1) + np.exp(-F32(x)))


def test_logits_are_clipped_then_go_through_the_sigmoid():
    options = dataclasses.replace(BLAZEFACE, score_clipping_thresh=2.0, min_score_thresh=None)
    found, _ = _scores(options, [[3.0], [5.0], [1.0], [-7.0]])
    assert found == [_sigmoid(2.0), _sigmoid(2.0), _sigmoid(1.0), _sigmoid(-2.0)]
    unclipped = dataclasses.replace(options, score_clipping_thresh=None)
    assert _scores(unclipped, [[3.0], [5.0], [-200.0]])[0] == [_sigmoid(3.0), _sigmoid(5.0), 0.0]


def test_without_the_sigmoid_scores_are_taken_as_they_are_and_never_clipped():
    options = dataclasses.replace(BLAZEFACE, sigmoid_score=False, score_clipping_thresh=2.0, min_score_thresh=None)
    assert _scores(options, [[3.0], [0.25]]) == ([3.0, 0.25], [0, 0])


def test_min_score_thresh_keeps_a_score_equal_to_it():
    options = dataclasses.replace(BLAZEFACE, sigmoid_score=False, min_score_thresh=0.5)
    assert _scores(options, [[0.5], [0.4999], [0.75]]) == ([0.5, 0.75], [0, 0])


THREE_CLASSES = dataclasses.replace(BLAZEFACE, num_classes=3, sigmoid_score=False, min_score_thresh=None)


def test_each_box_takes_its_best_class_the_lower_id_on_a_tie():
    assert _scores(THREE_CLASSES, [[0.25, 0.75, 0.75], [0.5, 0.125, 0.25], [0.0, 0.0, 0.0]]) == \
        ([0.75, 0.5, 0.0], [1, 0, 0])


def test_ignored_classes_are_never_a_boxs_class():
    options = dataclasses.replace(THREE_CLASSES, ignore_classes=(0, 1))
    assert _scores(options, [[0.9, 0.8, 0.25], [0.5, 0.125, 0.375]]) == ([0.25, 0.375], [2, 2])


def test_a_nan_score_is_never_the_best_and_a_box_with_none_is_dropped():
    assert _scores(THREE_CLASSES, [[np.nan, 0.25, np.nan], [np.nan] * 3, [-np.inf] * 3]) == ([0.25], [1])


# --- NMS ----------------------------------------------------------------------------------

# a and b overlap by IoU 0.6 and b and c by 1/3 (both > 0.3), a and c by 1/7; d stands apart.
A = [0.0, 0.0, 0.5, 0.5]
B = [0.125, 0.0, 0.625, 0.5]
C = [0.375, 0.0, 0.875, 0.5]
D = [0.0, 0.75, 0.25, 1.0]
BOXES = np.array([A, B, C, D], dtype=F32)
SCORES = np.array([0.9, 0.6, 0.3, 0.5], dtype=F32)
POINTS = np.array([[[0.25, 0.25]], [[0.5, 0.25]], [[0.5, 0.5]], [[0.125, 0.875]]], dtype=F32)
CLASSES = np.array([0, 0, 1, 2])


def test_the_overlaps_the_nms_tests_rest_on():
    # Each box is 0.25 in area. a, b share 0.375 x 0.5; a, c 0.125 x 0.5; b, c 0.25 x 0.5.
    assert ious(np.array(A), np.array([B, C, D])).tolist() == pytest.approx([0.1875 / 0.3125, 0.0625 / 0.4375, 0.0])
    assert ious(np.array(B), np.array([C])).tolist() == pytest.approx([0.125 / 0.375])


def test_weighted_nms_averages_each_cluster_by_score_and_keeps_the_best_ones_score():
    boxes, points, scores, classes = suppress(BOXES, POINTS, SCORES, CLASSES, NmsOptions(0.3, None, WEIGHTED))
    # a's cluster is a and b (c overlaps b, not a: it starts its own); d is alone.
    mean = (0.9 * np.array(A) + 0.6 * np.array(B)) / 1.5
    np.testing.assert_allclose(boxes, [mean, D, C], atol=1e-7)
    np.testing.assert_allclose(points, [[[(0.9 * 0.25 + 0.6 * 0.5) / 1.5, 0.25]], [[0.125, 0.875]], [[0.5, 0.5]]],
                               atol=1e-7)
    assert scores.tolist() == [F32(0.9), F32(0.5), F32(0.3)] and classes.tolist() == [0, 2, 1]
    assert boxes.dtype == F32 and points.dtype == F32


def test_hard_nms_keeps_the_best_box_as_it_is_and_drops_its_overlaps():
    boxes, points, scores, classes = suppress(BOXES, POINTS, SCORES, CLASSES, NmsOptions(0.3, None, HARD))
    # b is dropped for a; c overlaps only the dropped b, so it stays.
    assert boxes.tolist() == [A, D, C] and points.tolist() == POINTS[[0, 3, 2]].tolist()
    assert scores.tolist() == [F32(0.9), F32(0.5), F32(0.3)] and classes.tolist() == [0, 2, 1]


@pytest.mark.parametrize("mode", [WEIGHTED, HARD])
def test_nms_stops_at_max_detections_best_first(mode):
    _, _, scores, classes = suppress(BOXES, POINTS, SCORES, CLASSES, NmsOptions(0.3, 2, mode))
    assert scores.tolist() == [F32(0.9), F32(0.5)] and classes.tolist() == [0, 2]


@pytest.mark.parametrize("mode", [WEIGHTED, HARD])
def test_nms_of_nothing_is_nothing(mode):
    empty = suppress(BOXES[:0], POINTS[:0], SCORES[:0], CLASSES[:0], NmsOptions(0.3, None, mode))
    assert [a.shape for a in empty] == [(0, 4), (0, 1, 2), (0,), (0,)]


def test_a_cluster_whose_scores_sum_to_zero_keeps_its_best_box():
    boxes, _, scores, _ = weighted_nms(BOXES[:2], POINTS[:2], np.zeros(2, dtype=F32), CLASSES[:2], 0.3)
    assert boxes.tolist() == [A] and scores.tolist() == [0.0]


boxes_strategy = st.lists(st.tuples(st.floats(0, 0.8), st.floats(0, 0.8), st.floats(0.01, 0.2), st.floats(0.01, 0.2),
                                    st.floats(0.01, 1.0)), min_size=1, max_size=20)


def _arrays(items: list) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    raw = np.array(items, dtype=np.float64)
    boxes = np.stack([raw[:, 0], raw[:, 1], raw[:, 0] + raw[:, 2], raw[:, 1] + raw[:, 3]], axis=1)
    points = boxes[:, None, :2].copy()
    return boxes, points, raw[:, 4], np.zeros(len(raw), dtype=np.intp)


@settings(max_examples=80, deadline=None)
@given(boxes_strategy, st.floats(0.0, 0.9))
def test_weighted_nms_clusters_lie_within_their_members_best_first(items, threshold):
    boxes, points, scores, classes = _arrays(items)
    merged, merged_points, kept_scores, _ = weighted_nms(boxes, points, scores, classes, threshold)
    assert 1 <= len(merged) <= len(boxes)
    assert list(kept_scores) == sorted(kept_scores, reverse=True) and set(kept_scores) <= set(scores)
    low, high = boxes.min(axis=0), boxes.max(axis=0)
    assert np.all(merged >= low - 1e-12) and np.all(merged <= high + 1e-12)
    assert np.allclose(merged_points[:, 0], merged[:, :2])  # the points were the corners: they average alike
    assert kept_scores[0] == scores.max()


@settings(max_examples=50, deadline=None)
@given(boxes_strategy)
def test_with_nothing_overlapping_enough_both_modes_keep_every_box_as_it_is(items):
    boxes, points, scores, classes = _arrays(items)
    order = np.argsort(-scores, kind="stable")
    for mode in (WEIGHTED, HARD):
        kept, _, kept_scores, _ = suppress(boxes, points, scores, classes, NmsOptions(1.0, None, mode))
        assert kept.tolist() == boxes[order].tolist() and kept_scores.tolist() == scores[order].tolist()


# --- detections ---------------------------------------------------------------------------

def test_two_anchors_of_one_cell_on_one_face_give_one_detection_clamped_to_the_input():
    # The cell's first two anchors (one centre, sizes 1): boxes 64 px and 80 px wide, the
    # second reaching past the input's right edge; logits 2 and 1 (sigmoid 0.88, 0.73).
    points = [(8.0, 8.0)] * 6
    rows = {CELL_ANCHOR: _offsets(16.0, 0.0, 64.0, 64.0, points, True),
            CELL_ANCHOR + 1: _offsets(24.0, 0.0, 80.0, 64.0, points, True)}
    boxes, scores = _heads(BLAZEFACE, rows, {CELL_ANCHOR: [2.0], CELL_ANCHOR + 1: [1.0]})
    found = detections(boxes, scores, ssd_anchors(SHORT_RANGE), BLAZEFACE)
    first, second = _sigmoid(2.0), _sigmoid(1.0)
    w1, w2 = first / (first + second), second / (first + second)
    x_min = CENTRE_X + w1 * (16 - 32) / 128 + w2 * (24 - 40) / 128
    x_max = min(CENTRE_X + w1 * (16 + 32) / 128 + w2 * (24 + 40) / 128, 1.0)
    assert len(found) == 1
    face = found[0]
    assert (face.index, face.score) == (0, float(first))
    assert dataclasses.astuple(face.box) == pytest.approx((x_min, CENTRE_Y - 0.25, x_max, CENTRE_Y + 0.25), abs=1e-6)
    assert face.box.x_max == 1.0
    np.testing.assert_allclose(face.keypoints, [(CENTRE_X + 1 / 16, CENTRE_Y + 1 / 16)] * 6, atol=1e-6)


def test_nothing_above_the_threshold_is_no_detections():
    boxes, scores = _heads(BLAZEFACE, {}, {})
    assert detections(boxes, scores, ssd_anchors(SHORT_RANGE), BLAZEFACE) == []


# --- the real BlazeFace -------------------------------------------------------------------

def test_blazeface_short_range_finds_the_astronauts_one_face():
    interpreter = pytest.importorskip("ai_edge_litert.interpreter")
    model = interpreter.Interpreter(model_path=str(real_model("face_detection_short_range.tflite")))
    model.allocate_tensors()
    with Image.open(real_model("astronaut.png")) as im:  # 512 x 512: no letterbox needed
        pixels = np.asarray(im.convert("RGB").resize((128, 128), Image.BILINEAR), dtype=F32)
    # MediaPipe's face detection graph feeds the model RGB scaled to [-1, 1].
    model.set_tensor(model.get_input_details()[0]["index"], (pixels / 127.5 - 1.0)[None])
    model.invoke()
    outputs = [model.get_tensor(d["index"]) for d in model.get_output_details()]
    box_output, score_output = find_outputs(BLAZEFACE, [o.shape for o in outputs])
    faces = detections(outputs[box_output], outputs[score_output], ssd_anchors(SHORT_RANGE), BLAZEFACE)
    assert len(faces) == 1
    face = faces[0]
    right_eye, left_eye, nose, mouth = face.keypoints[:4]
    # A portrait: the face in the upper half; eyes, nose and mouth inside its box, top to bottom.
    assert face.score > 0.5 and face.box.y_max < 0.5
    for x, y in (right_eye, left_eye, nose, mouth):
        assert face.box.x_min < x < face.box.x_max and face.box.y_min < y < face.box.y_max
    assert max(right_eye[1], left_eye[1]) < nose[1] < mouth[1]
