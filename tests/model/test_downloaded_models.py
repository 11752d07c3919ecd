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
    raw = {"mqtt": {"broker": "localhost:1883"}, "cache": {"dir": str(tmp_path / "cache")},
           "models": {"m": {"path": str(real_model(model))}},
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
