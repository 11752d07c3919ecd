"""Models as people download them (MediaPipe's and openWakeWord's float graphs from packages),
served by config alone and checked against a direct invoke: named outputs, an input sized at
start-up from its route, and a JPEG decoded exactly when the route asks."""

from __future__ import annotations

import importlib
import io
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from daemon.config.loader import load_config
from daemon.config.model_files import open_model
from daemon.errors import ConfigError
from daemon.model.runtime import BACKENDS, resolve_backend
from daemon.pipeline import images
from daemon.pipeline.request_path import handle
from daemon.pipeline.route_pipeline import route_pipeline
from tests.real_models import real_model

POSE = "pose_landmark_full.tflite"
MEL = "openwakeword_melspectrogram.tflite"
MEL_SAMPLES = 1280  # 80 ms at 16 kHz: five 512-sample windows, 160 apart


def _config(tmp_path: Path, model: str, route: dict) -> Path:
    entry = {"path": str(real_model(model))}
    if route.get("output", {}).get("kind") == "detect":  # a detector names what it finds
        (tmp_path / "labels.txt").write_text("face\n")
        entry["labels"] = str(tmp_path / "labels.txt")
    raw = {"mqtt": {"broker": "localhost:1883"}, "cache": {"dir": str(tmp_path / "cache")},
           "models": {"m": entry},
           "routes": [{"name": "r", "subscribe": "s/+/x", "model": "m", "publish": "r/{1}", **route}]}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _reply(config_path: Path, payload: bytes) -> dict:
    config = load_config(config_path)
    route = config.routes[0]
    model = open_model(config, route.model, max_batch=1)
    return handle(route_pipeline(config, route, model), payload, model, None, time.monotonic(), time.monotonic)


def _direct(model: str, x: np.ndarray) -> dict[str, np.ndarray]:
    interp = importlib.import_module(BACKENDS[resolve_backend()]).Interpreter(model_path=str(real_model(model)))
    interp.resize_tensor_input(interp.get_input_details()[0]["index"], list(x.shape))
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return {d["name"]: interp.get_tensor(d["index"]) for d in interp.get_output_details()}


def _jpeg(name: str) -> bytes:
    buf = io.BytesIO()
    Image.open(real_model(name)).convert("RGB").save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def _pose_route(**output) -> dict:
    return {"input": {"format": "image", "shape": [256, 256, 3], "dtype": "uint8", "decode": "exact"},
            "preprocess": [{"normalize": {"mean": 0.0, "std": 255.0}}],  # BlazePose takes 0..1
            "output": {"kind": "values", **output}}


def test_named_outputs_of_a_float16_pose_model_come_back_by_name_as_a_direct_invoke(tmp_path):
    payload = _jpeg("astronaut.png")
    reply = _reply(_config(tmp_path, POSE, _pose_route(outputs=["Identity", "Identity_4", "Identity_1"])), payload)
    assert set(reply["values"]) == {"Identity", "Identity_4", "Identity_1"} and "left_out" not in reply
    pixels, _ = images.decode_image(payload, 256, 256, 3, draft=False)
    direct = _direct(POSE, (pixels.astype(np.float32) / 255.0)[None])
    for name in reply["values"]:
        np.testing.assert_allclose(np.array(reply["values"][name]), direct[name][0], atol=1e-4)
    landmarks = np.array(reply["values"]["Identity"]).reshape(39, 5)  # x, y, z, visibility, presence
    assert reply["values"]["Identity_1"][0] > 0.5  # a person is there (pose flag)
    assert 0 < landmarks[0, 0] < 256 and 0 < landmarks[0, 1] < 256  # the nose, in the input's pixels


def test_large_outputs_are_left_out_unless_named_and_the_reply_says_which(tmp_path):
    reply = _reply(_config(tmp_path, POSE, _pose_route()), _jpeg("astronaut.png"))
    assert set(reply["values"]) == {"Identity", "Identity_1", "Identity_4"}
    assert reply["left_out"] == {"Identity_2": [256, 256, 1], "Identity_3": [64, 64, 39]}  # mask, heatmaps
    named = _reply(_config(tmp_path, POSE, _pose_route(outputs=["Identity_2"])), _jpeg("astronaut.png"))
    assert np.array(named["values"]["Identity_2"]).shape == (256, 256, 1)


def test_an_unknown_output_name_is_refused_naming_the_outputs_there_are(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(_config(tmp_path, POSE, _pose_route(outputs=["landmarks"])))
    (line,) = [e for e in err.value.errors if e.startswith("routes[0].output.outputs:")]
    assert "'landmarks': no such output of 'm'" in line and "Identity_4 [1, 117]" in line


def test_a_dynamic_audio_input_is_sized_from_its_route_and_answers_as_a_direct_invoke(tmp_path):
    samples = (np.random.default_rng(36).standard_normal(MEL_SAMPLES) * 3000).astype(np.float32)
    path = _config(tmp_path, MEL, {"input": {"format": "raw", "shape": [MEL_SAMPLES], "dtype": "float32"},
                                   "output": {"kind": "values"}})
    reply = _reply(path, samples.astype("<f4").tobytes())
    (name,) = reply["values"]
    got = np.array(reply["values"][name])
    want = _direct(MEL, samples[None])[name][0]
    assert got.shape == want.shape == (1, 5, 32)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3)


def test_a_dynamic_input_with_no_route_to_size_it_is_refused_naming_the_key(tmp_path):
    raw = {"mqtt": {"broker": "localhost:1883"}, "cache": {"dir": str(tmp_path / "cache")},
           "models": {"mel": {"path": str(real_model(MEL))}}, "routes": []}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    (line,) = [e for e in err.value.errors if e.startswith("models.mel.path:")]
    assert "dynamic dimension(s) [1]" in line and "routes[].input.shape" in line
    assert "failed to prepare" not in line


def test_decode_exact_is_a_full_decode_and_fast_the_draft_one(tmp_path):
    payload = _jpeg("astronaut.png")  # 512 px: at least twice 256, so the draft decodes at 1/2
    exact = _reply(_config(tmp_path, POSE, _pose_route(outputs=["Identity_1"])), payload)
    route = _pose_route(outputs=["Identity_1"])
    route["input"]["decode"] = "fast"
    fast = _reply(_config(tmp_path, POSE, route), payload)
    full, _ = images.decode_image(payload, 256, 256, 3, draft=False)
    draft, _ = images.decode_image(payload, 256, 256, 3, draft=True)
    assert not np.array_equal(full, draft)  # the two decodes differ here, so the switch is seen
    for pixels, reply in ((full, exact), (draft, fast)):
        want = _direct(POSE, (pixels.astype(np.float32) / 255.0)[None])["Identity_1"][0]
        np.testing.assert_allclose(reply["values"]["Identity_1"], want, atol=1e-5)


BLAZEFACE = "face_detection_short_range.tflite"
# MediaPipe's face_detection_short_range graph (its SsdAnchorsCalculator and
# TensorsToDetectionsCalculator options), key by key.
BLAZEFACE_OUTPUT = {
    "kind": "detect", "decode": "anchors", "min_score": 0.5, "max_results": 10,
    "anchors": {"num_layers": 4, "min_scale": 0.1484375, "max_scale": 0.75, "input_size_height": 128,
                "input_size_width": 128, "anchor_offset_x": 0.5, "anchor_offset_y": 0.5, "strides": [8, 16, 16, 16],
                "aspect_ratios": [1.0], "fixed_anchor_size": True},
    "num_classes": 1, "num_boxes": 896, "num_coords": 16, "box_coord_offset": 0, "keypoint_coord_offset": 4,
    "num_keypoints": 6, "num_values_per_keypoint": 2, "sigmoid_score": True, "score_clipping_thresh": 100.0,
    "reverse_output_order": True, "x_scale": 128.0, "y_scale": 128.0, "h_scale": 128.0, "w_scale": 128.0,
    "min_score_thresh": 0.5, "nms": {"iou": 0.3, "mode": "weighted"},
}


def _blazeface_route(**output) -> dict:
    return {"input": {"format": "image", "shape": [128, 128, 3], "dtype": "uint8", "resize": "letterbox",
                      "decode": "exact"},
            "preprocess": [{"normalize": {"mean": 127.5, "std": 127.5}}],  # pixels -> -1..1, as MediaPipe feeds it
            "output": {**BLAZEFACE_OUTPUT, **output}}


def _reference_faces(payload: bytes, side: int) -> list[tuple[np.ndarray, np.ndarray, float]]:
    """A decode written here from MediaPipe's formulas: the short-range anchors (a 16x16 grid with 2
    per cell, then 8x8 with 6), offsets in input pixels from each anchor's centre, sigmoid scores,
    then weighted NMS (each cluster's boxes and keypoints averaged by score); (box, keypoints, score)
    in the sent image's pixels (a square photo: the letterbox is a plain scale)."""
    pixels, _ = images.decode_image(payload, 128, 128, 3, "letterbox", draft=False)
    out = _direct(BLAZEFACE, ((pixels.astype(np.float32) - 127.5) / 127.5)[None])
    raw, logits = out["regressors"][0], out["classificators"][0, :, 0]
    centres = np.array([((x + 0.5) / grid, (y + 0.5) / grid) for grid, per in ((16, 2), (8, 6))
                        for y in range(grid) for x in range(grid) for _ in range(per)])
    scores = 1 / (1 + np.exp(-np.clip(logits, -80, 80)))
    r = raw / 128.0
    xy, wh = centres + r[:, :2], r[:, 2:4]
    boxes = np.concatenate([xy - wh / 2, xy + wh / 2], axis=1)
    points = centres[:, None, :] + r[:, 4:16].reshape(-1, 6, 2)
    faces, left = [], [i for i in np.argsort(-scores) if scores[i] >= 0.5]
    while left:
        best = boxes[left[0]]
        lo, hi = np.maximum(best[:2], boxes[left, :2]), np.minimum(best[2:], boxes[left, 2:])
        inter = np.prod(np.clip(hi - lo, 0, None), axis=1)
        areas = np.prod(boxes[left, 2:] - boxes[left, :2], axis=1)
        iou = inter / (np.prod(best[2:] - best[:2]) + areas - inter)
        cluster = [i for i, v in zip(left, iou) if v > 0.3]
        w = scores[cluster][:, None]
        faces.append(((boxes[cluster] * w).sum(0) / w.sum() * side, (points[cluster] * w[:, :, None]).sum(0)
                      / w.sum() * side, float(scores[left[0]])))
        left = [i for i, v in zip(left, iou) if v <= 0.3]
    return faces


def _iou(a, b) -> float:
    lo, hi = np.maximum(a[:2], b[:2]), np.minimum(a[2:], b[2:])
    inter = float(np.prod(np.clip(hi - lo, 0, None)))
    return inter / (float(np.prod(a[2:] - a[:2])) + float(np.prod(b[2:] - b[:2])) - inter)


@pytest.mark.parametrize("photo", ["astronaut.png", "coffee.png"])
def test_a_raw_anchor_face_detector_answers_as_a_direct_invoke_and_a_reference_decode(tmp_path, photo):
    payload = Path(real_model(photo)).read_bytes()  # PNG: the same pixels for the daemon and here
    side = Image.open(real_model(photo)).size
    reply = _reply(_config(tmp_path, BLAZEFACE, _blazeface_route()), payload)
    want = _reference_faces(payload, max(side)) if side[0] == side[1] else None
    got = reply["detections"]
    if photo == "coffee.png":  # a cup, no face (its 600x400 letterbox is checked by the astronaut's square)
        assert got == [] and reply["model"] == "m"
        return
    assert len(got) == len(want) == 1
    (box, points, score), (d,) = want[0], got
    daemon_box = np.array([d["box"][k] for k in ("x_min", "y_min", "x_max", "y_max")])
    assert _iou(daemon_box, box) >= 0.9 and d["score"] == pytest.approx(score, abs=1e-4)
    assert len(d["keypoints"]) == 6
    assert np.abs(np.array(d["keypoints"]) - points).max() <= 1.0  # within a pixel of the sent image


def test_an_anchor_count_that_is_not_the_models_is_refused_naming_both(tmp_path):
    output = {**BLAZEFACE_OUTPUT, "num_boxes": 2304,
              "anchors": {**BLAZEFACE_OUTPUT["anchors"], "num_layers": 1, "strides": [4],
                          "input_size_height": 192, "input_size_width": 192, "interpolated_scale_aspect_ratio": 0.0}}
    with pytest.raises(ConfigError) as err:
        load_config(_config(tmp_path, BLAZEFACE, _blazeface_route(**output)))
    text = "\n".join(err.value.errors)
    assert "[1, 2304, 16]" in text and "[1, 896, 16]" in text, text
