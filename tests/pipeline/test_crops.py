"""Sub-labels' pure parts: which boxes are classified, the pixels each crop covers (padded, clipped),
the labels written back, and a batch's crops classified together (a counting stand-in for the
classifier: the real models run in tests/integration/test_sub_labels.py)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from daemon.config.schema import InputConfig, RouteConfig
from daemon.config.then import ThenConfig
from daemon.pipeline import crops, images, sub_labels
from daemon.pipeline.route_pipeline import Outcome, Request, RoutePipeline


def _box(x_min, y_min, x_max, y_max, score=0.9) -> dict:
    return {"label": "cat", "index": 16, "score": score,
            "box": {"x_min": x_min, "y_min": y_min, "x_max": x_max, "y_max": y_max}}


def test_the_boxes_chosen_pass_min_score_highest_first_and_at_most_max_crops():
    boxes = [_box(0, 0, 1, 1, s) for s in (0.6, 0.9, 0.3, 0.9, 0.7)]
    assert crops.chosen(boxes, 0.5, 10) == [1, 3, 4, 0]  # ties keep the reply's order
    assert crops.chosen(boxes, 0.5, 2) == [1, 3]
    assert crops.chosen(boxes, 0.0, 10) == [1, 3, 4, 0, 2]
    assert crops.chosen(boxes, 0.95, 10) == [] and crops.chosen([], 0.0, 3) == []


def test_pad_is_a_fraction_of_the_box_on_each_side_out_to_whole_pixels():
    box = {"x_min": 100.0, "y_min": 50.0, "x_max": 200.0, "y_max": 90.0}  # 100 x 40
    assert crops.padded_region(box, 0.0, 640, 480) == (100, 50, 200, 90)
    assert crops.padded_region(box, 0.1, 640, 480) == (90, 46, 210, 94)
    assert crops.padded_region(box, 0.5, 640, 480) == (50, 30, 250, 110)
    fractional = {"x_min": 10.4, "y_min": 20.6, "x_max": 30.2, "y_max": 40.5}
    assert crops.padded_region(fractional, 0.0, 640, 480) == (10, 20, 31, 41)  # the box's pixels, all of them


def test_a_padded_box_is_clipped_to_the_image_and_never_empty():
    corner = {"x_min": 0.0, "y_min": 0.0, "x_max": 50.0, "y_max": 100.0}
    assert crops.padded_region(corner, 0.2, 60, 110) == (0, 0, 60, 110)
    edge = {"x_min": 640.0, "y_min": 480.0, "x_max": 640.0, "y_max": 480.0}  # empty, on the far corner
    assert crops.padded_region(edge, 0.3, 640, 480) == (639, 479, 640, 480)
    line = {"x_min": 5.0, "y_min": 7.0, "x_max": 5.0, "y_max": 9.0}
    assert crops.padded_region(line, 0.0, 640, 480) == (5, 7, 6, 9)


def test_attach_labels_the_chosen_boxes_and_nulls_the_others():
    boxes = [_box(0, 0, 1, 1, s) for s in (0.9, 0.4, 0.8)]
    crops.attach(boxes, [0, 2], ["tabby", "Egyptian cat"], [0.7, 0.6])
    assert [(b["sub_label"], b["sub_score"]) for b in boxes] == [("tabby", 0.7), (None, None), ("Egyptian cat", 0.6)]


def _png(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def test_a_region_is_cut_at_full_resolution_and_resized_like_a_sent_picture():
    pixels = np.zeros((300, 400, 3), np.uint8)
    pixels[100:200, 50:150] = (200, 30, 10)  # a red square
    picture = images.decode_full(_png(pixels), 3)
    assert picture.size == (400, 300)
    out = images.fit(picture.crop((50, 100, 150, 200)), 8, 8, 3)
    assert out.shape == (8, 8, 3) and (out == (200, 30, 10)).all()
    boxed = images.fit(picture.crop((50, 100, 150, 150)), 8, 8, 3, "letterbox")  # 100 x 50: padded above, below
    assert (boxed[0] == images.LETTERBOX_PAD).all() and (boxed[4] == (200, 30, 10)).all()


class _CountingClassifier:
    """Scores a crop by its mean red, green and blue: the brightest channel wins."""

    cost_per_sample_s, num_outputs = 0.0, 3

    def __init__(self):
        self.calls: list[int] = []

    def quantize(self, batch: np.ndarray, as_is: bool = False) -> np.ndarray:
        return batch

    def infer_quantized(self, q: np.ndarray) -> np.ndarray:
        self.calls.append(len(q))
        means = q.reshape(len(q), -1, 3).mean(axis=1)
        return (means / means.sum(axis=1, keepdims=True)).astype(np.float32)

    def take_invokes(self) -> list:
        return []


def _pipes(then: ThenConfig) -> RoutePipeline:
    image = InputConfig(format="image", shape=(16, 16, 3), dtype="uint8")
    classify = RouteConfig("cls", "c/+", "effnet", image, (), 1, "c/{1}")
    detect = RouteConfig("cam", "k/+", "ssd", image, (), 1, "k/{1}", kind="detect", then=then)
    return RoutePipeline(detect, "0" * 64, ("cat",), then_to=RoutePipeline(classify, "1" * 64, ("red", "green", "blue")))


def test_a_batch_s_crops_are_classified_in_one_call_and_each_box_gets_its_own_label():
    pixels = np.zeros((100, 200, 3), np.uint8)
    pixels[10:50, 10:50] = (250, 0, 0)
    pixels[10:50, 100:140] = (0, 0, 250)
    payload = _png(pixels)
    red, blue = _box(10, 10, 50, 50, 0.9), _box(100, 10, 140, 50, 0.8)
    weak = _box(0, 60, 200, 100, 0.2)
    replies = [{"detections": [red, blue, weak], "latency_ms": 0.0}, {"error": {"code": "bad_payload"}},
               {"detections": [dict(blue, box=dict(blue["box"]))], "latency_ms": 0.0}]
    outcome = Outcome(replies)
    model = _CountingClassifier()
    requests = [Request(payload, 0.0)] * 3
    pipe = _pipes(ThenConfig("cls", pad=0.0, max_crops=2, min_score=0.5))
    assert sub_labels.classify_boxes(pipe, requests, outcome, model, lambda: 1.0) == 3
    assert model.calls == [3]  # one call for the batch (the runner splits it into its buckets)
    first = outcome.replies[0]["detections"]
    assert [d["sub_label"] for d in first] == ["red", "blue", None] and first[2]["sub_score"] is None
    assert outcome.replies[2]["detections"][0]["sub_label"] == "blue"
    assert "detections" not in outcome.replies[1]
    assert outcome.replies[0]["latency_ms"] == pytest.approx(1000.0) and "sub_labels" in outcome.stages


def test_no_box_to_classify_runs_no_invoke_and_every_box_says_null():
    outcome = Outcome([{"detections": [_box(0, 0, 5, 5, 0.3)], "latency_ms": 0.0}])
    model = _CountingClassifier()
    pipe = _pipes(ThenConfig("cls", min_score=0.5))
    assert sub_labels.classify_boxes(pipe, [Request(b"not read", 0.0)], outcome, model, lambda: 0.0) == 0
    assert model.calls == [] and outcome.replies[0]["detections"][0]["sub_label"] is None
