"""`output.decode: anchors` (daemon/config/anchors.py): BlazeFace's graph copied key by key reads
back as written, defaults are MediaPipe's where those work, every mistake is named by its key
path, and the anchor count and the model's outputs are checked with both numbers named.

The loader does not call the reader yet: these tests call it on a YAML file of their own."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from daemon.config.anchors import (ANCHOR_DECODE_KEYS, DEFAULT_NMS_IOU, DEFAULT_NMS_MODE, HARD, AnchorDecode,
                                   AnchorOptions, NmsOptions, expected_boxes, find_outputs, read_anchor_decode)
from daemon.config.reader import Reader, load_yaml

OUT = "routes[0].output"
# face_detection_short_range_common.pbtxt, its two calculators' options as a route's output.
SHORT_RANGE_ANCHORS = {"num_layers": 4, "min_scale": 0.1484375, "max_scale": 0.75, "input_size_height": 128,
                       "input_size_width": 128, "anchor_offset_x": 0.5, "anchor_offset_y": 0.5,
                       "strides": [8, 16, 16, 16], "aspect_ratios": [1.0], "fixed_anchor_size": True}
SHORT_RANGE = {"kind": "detect", "decode": "anchors", "anchors": SHORT_RANGE_ANCHORS,
               "num_classes": 1, "num_boxes": 896, "num_coords": 16, "box_coord_offset": 0,
               "keypoint_coord_offset": 4, "num_keypoints": 6, "num_values_per_keypoint": 2,
               "sigmoid_score": True, "score_clipping_thresh": 100.0, "reverse_output_order": True,
               "x_scale": 128.0, "y_scale": 128.0, "h_scale": 128.0, "w_scale": 128.0, "min_score_thresh": 0.5,
               "nms": {"iou": 0.3, "max_detections": 5, "mode": "weighted"}}


def _read(tmp_path: Path, output: dict) -> tuple[AnchorDecode | None, list[str]]:
    path = tmp_path / "route.yaml"
    path.write_text(yaml.safe_dump({"routes": [{"output": output}]}, sort_keys=False))
    raw, problems = load_yaml(path)
    r = Reader(raw, problems)
    return read_anchor_decode(r, raw["routes"][0]["output"], OUT), r.errors


def _errors(tmp_path: Path, **changes) -> str:
    output = {**SHORT_RANGE, **changes}
    found, errors = _read(tmp_path, {k: v for k, v in output.items() if v is not None})
    assert errors, found
    return "\n".join(errors)


def test_blazeface_short_range_reads_back_as_its_graph_says(tmp_path):
    decode, errors = _read(tmp_path, SHORT_RANGE)
    assert errors == []
    assert decode.anchors == AnchorOptions(4, 0.1484375, 0.75, 128, 128, 0.5, 0.5, (8, 16, 16, 16), (1.0,),
                                           False, 1.0, True)
    assert (decode.num_classes, decode.num_boxes, decode.num_coords) == (1, 896, 16)
    assert (decode.keypoint_coord_offset, decode.num_keypoints, decode.num_values_per_keypoint) == (4, 6, 2)
    assert (decode.x_scale, decode.y_scale, decode.w_scale, decode.h_scale) == (128.0,) * 4
    assert decode.sigmoid_score and decode.reverse_output_order and not decode.apply_exponential_on_box_size
    assert (decode.score_clipping_thresh, decode.min_score_thresh) == (100.0, 0.5)
    assert decode.nms == NmsOptions(0.3, 5, "weighted")


def test_the_defaults_are_mediapipes_and_num_boxes_is_the_anchor_count(tmp_path):
    minimal = {"decode": "anchors", "anchors": {k: SHORT_RANGE_ANCHORS[k] for k in
                                                ("num_layers", "min_scale", "max_scale", "input_size_height",
                                                 "input_size_width", "strides")},
               "num_classes": 1, "num_coords": 4, "x_scale": 10, "y_scale": 10, "w_scale": 5, "h_scale": 5}
    decode, errors = _read(tmp_path, minimal)
    assert errors == []
    a = decode.anchors
    assert (a.anchor_offset_x, a.anchor_offset_y, a.aspect_ratios, a.interpolated_scale_aspect_ratio) == \
        (0.5, 0.5, (1.0,), 1.0)
    assert not (a.reduce_boxes_in_lowest_layer or a.fixed_anchor_size)
    assert decode.num_boxes == expected_boxes(a) == 896
    assert (decode.box_coord_offset, decode.num_keypoints, decode.num_values_per_keypoint) == (0, 0, 2)
    assert not (decode.sigmoid_score or decode.reverse_output_order or decode.apply_exponential_on_box_size)
    assert (decode.score_clipping_thresh, decode.min_score_thresh, decode.ignore_classes) == (None, None, ())
    assert decode.nms == NmsOptions(DEFAULT_NMS_IOU, None, DEFAULT_NMS_MODE) == NmsOptions(0.3, None, "weighted")


def test_without_decode_the_route_has_none_and_its_keys_are_refused(tmp_path):
    assert _read(tmp_path, {"kind": "detect"}) == (None, [])
    decode, errors = _read(tmp_path, {"kind": "detect", "num_classes": 3, "nms": {"iou": 0.5}})
    assert decode is None
    assert [e.partition(" (line")[0] for e in errors] == [f"{OUT}.num_classes: applies to decode: anchors only",
                                                         f"{OUT}.nms: applies to decode: anchors only"]


def test_the_known_keys_are_every_field_and_decode():
    assert set(ANCHOR_DECODE_KEYS) == {"decode", *AnchorDecode.__dataclass_fields__}
    assert len(ANCHOR_DECODE_KEYS) == len(set(ANCHOR_DECODE_KEYS))


def test_num_boxes_must_be_the_anchor_count_and_both_are_named(tmp_path):
    expected = f"{OUT}.num_boxes: is 900, but the anchors options lay out 896 anchors"
    assert expected in _errors(tmp_path, num_boxes=900)


@pytest.mark.parametrize("changes, expected", [
    ({"decode": "yolo"}, f"{OUT}.decode: must be one of anchors, got 'yolo'"),
    ({"anchors": None}, f"{OUT}.anchors: is required and must be a mapping"),
    ({"num_classes": None}, f"{OUT}.num_classes: is required"),
    ({"num_classes": 0}, f"{OUT}.num_classes: must be >= 1"),
    ({"num_coords": None}, f"{OUT}.num_coords: is required"),
    ({"x_scale": 0}, f"{OUT}.x_scale: must be > 0, got 0"),
    ({"h_scale": None}, f"{OUT}.h_scale: is required"),
    ({"num_values_per_keypoint": 1}, f"{OUT}.num_values_per_keypoint: must be >= 2"),
    ({"keypoint_coord_offset": None}, f"{OUT}.keypoint_coord_offset: is required"),
    ({"score_clipping_thresh": -1}, f"{OUT}.score_clipping_thresh: must be > 0, got -1"),
    ({"sigmoid_score": "yes"}, f"{OUT}.sigmoid_score: must be true or false"),
    ({"ignore_classes": [1]}, f"{OUT}.ignore_classes: must list class ids in 0..0 (num_classes is 1), got [1]"),
    ({"ignore_classes": [0]}, f"{OUT}.ignore_classes: ignores every one of the 1 classes"),
    ({"nms": {"mode": "soft"}}, f"{OUT}.nms.mode: must be one of weighted, hard, got 'soft'"),
    ({"nms": {"max_detections": 0}}, f"{OUT}.nms.max_detections: must be >= 1"),
    ({"nms": {"overlap": 0.3}}, f"{OUT}.nms.overlap: unknown key"),
])
def test_each_decode_mistake_is_named_by_its_key_path(tmp_path, changes, expected):
    assert expected in _errors(tmp_path, **changes)


def test_num_coords_must_hold_the_box_and_the_keypoints(tmp_path):
    assert (f"{OUT}.num_coords: must hold the box: at least box_coord_offset + 4 = 14, got 12"
            in _errors(tmp_path, num_coords=12, box_coord_offset=10, num_keypoints=0))
    assert (f"{OUT}.num_coords: must hold the keypoints: at least keypoint_coord_offset + num_keypoints x "
            f"num_values_per_keypoint = 4 + 6 x 2 = 16, got 15" in _errors(tmp_path, num_coords=15))
    decode, errors = _read(tmp_path, {**SHORT_RANGE, "num_coords": 20, "num_values_per_keypoint": 2})
    assert errors == [] and decode.num_coords == 20  # room to spare is allowed: the rest is not read


@pytest.mark.parametrize("anchors, expected", [
    ({"num_layers": 0}, f"{OUT}.anchors.num_layers: must be >= 1"),
    ({"strides": None}, f"{OUT}.anchors.strides: is required"),
    ({"strides": [8, 16]}, f"{OUT}.anchors.strides: must give one stride per layer: num_layers is 4, got 2"),
    ({"strides": [8, 0, 16, 16]}, f"{OUT}.anchors.strides: must be a list of positive integers"),
    ({"strides": [8, 16.5, 16, 16]}, f"{OUT}.anchors.strides: must be a list of positive integers"),
    ({"aspect_ratios": []}, f"{OUT}.anchors.aspect_ratios: must list at least one aspect ratio"),
    ({"aspect_ratios": [1.0, -2]}, f"{OUT}.anchors.aspect_ratios: must be a list of positive numbers"),
    ({"min_scale": None}, f"{OUT}.anchors.min_scale: is required"),
    ({"input_size_width": 0}, f"{OUT}.anchors.input_size_width: must be >= 1"),
    ({"interpolated_scale_aspect_ratio": -1.0}, f"{OUT}.anchors.interpolated_scale_aspect_ratio: must be >= 0"),
    ({"feature_map_width": [16]}, f"{OUT}.anchors.feature_map_width: unknown key"),
])
def test_each_anchor_mistake_is_named_by_its_key_path(tmp_path, anchors, expected):
    merged = {k: v for k, v in {**SHORT_RANGE_ANCHORS, **anchors}.items() if v is not None}
    errors = _errors(tmp_path, anchors=merged)
    assert expected in errors
    assert "num_boxes" not in errors  # no count is compared with anchors that could not be read


# --- the model's outputs ------------------------------------------------------------------

BLAZEFACE = AnchorDecode(anchors=AnchorOptions(4, 0.1484375, 0.75, 128, 128, strides=(8, 16, 16, 16),
                                               fixed_anchor_size=True),
                         num_classes=1, num_boxes=896, num_coords=16, keypoint_coord_offset=4, num_keypoints=6)


@pytest.mark.parametrize("shapes, found", [
    ([(1, 896, 16), (1, 896, 1)], (0, 1)),
    ([(1, 896, 1), (1, 896, 16)], (1, 0)),        # either order: told apart by their last axis
    ([(896, 16), (896, 1)], (0, 1)),              # sample shapes, the batch dropped
    ([(1, 1, 896, 16), (1, 1, 896, 1)], (0, 1)),  # MediaPipe's GPU layout
    ([(1, 896, 16), (1, 896)], (0, 1)),           # one class: its scores may come flat
])
def test_the_box_and_score_outputs_are_found_by_shape(shapes, found):
    assert find_outputs(BLAZEFACE, shapes) == found


def test_with_as_many_classes_as_coords_the_box_output_comes_first():
    square = AnchorDecode(anchors=BLAZEFACE.anchors, num_classes=4, num_boxes=896, num_coords=4)
    assert find_outputs(square, [(1, 896, 4), (1, 896, 4)]) == (0, 1)


@pytest.mark.parametrize("shapes", [[(1, 2304, 16), (1, 2304, 1)], [(1, 896, 16)], [(1, 896, 12), (1, 896, 1)], []])
def test_outputs_that_do_not_fit_name_both_sides(shapes):
    with pytest.raises(ValueError) as caught:
        find_outputs(BLAZEFACE, shapes)
    message = str(caught.value)
    assert "a box output [1, 896, 16] (num_boxes x num_coords)" in message
    assert "a score output [1, 896, 1] (num_boxes x num_classes)" in message
    assert ("the model has " + (", ".join(str(list(s)) for s in shapes) or "no outputs")) in message


def test_a_hard_nms_is_read(tmp_path):
    decode, errors = _read(tmp_path, {**SHORT_RANGE, "nms": {"mode": "hard", "iou": 0.5}})
    assert errors == [] and decode.nms == NmsOptions(0.5, None, HARD)
