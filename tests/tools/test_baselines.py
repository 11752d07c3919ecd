"""The naive scripts (`python -m daemon.tools.baselines naive`, `naive-detect` and `naive-audio`) do what the daemon does."""

from __future__ import annotations

import io
import json
import time

import numpy as np
import pytest
import yaml
from PIL import Image

from daemon.config.loader import load_config
from daemon.pipeline.evaluate import find_route
from daemon.model.runtime import Model
from daemon.pipeline.request_path import handle
from daemon.pipeline.route_pipeline import route_pipeline
from daemon.tools.baselines import make_answer, make_audio_answer, make_detect_answer
from tests.integration.conftest import ROOT
from tests.model.test_stages_chain import SCORE_TOLERANCE, chain_config, direct_scores
from tests.real_models import real_model


def test_naive_detect_finds_the_daemons_detections_on_the_same_jpeg(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({
        "mqtt": {"broker": "localhost:1883"}, "cache": {"dir": str(tmp_path / "cache")},
        "models": {"ssd": {"path": str(real_model("ssd_mobilenet_v2_coco_quant.tflite")),
                           "labels": str(real_model("coco_labels.txt"))}},
        "routes": [{"name": "cam", "subscribe": "cameras/+/jpeg", "model": "ssd", "publish": "results/{1}/objects",
                    "input": {"format": "image", "shape": [300, 300, 3], "dtype": "uint8", "resize": "stretch"},
                    "output": {"kind": "detect", "min_score": 0.5, "max_results": 10}}]}))
    config = load_config(path)
    model = Model(config.models["ssd"].path)
    pipe = route_pipeline(config, config.routes[0], model)
    _, answer = make_detect_answer(path, "cam")
    for photo, subject in (("astronaut.png", "person"), ("chelsea.png", "cat"), ("coffee.png", "cup")):
        buf = io.BytesIO()
        Image.open(real_model(photo)).convert("RGB").resize((640, 480)).save(buf, "JPEG", quality=85)
        naive = json.loads(answer(buf.getvalue()))
        daemon = handle(pipe, buf.getvalue(), model, None, time.monotonic(), time.monotonic)
        assert naive["detections"] == daemon["detections"]
        assert naive["detections"][0]["label"] == subject


def _payload(route, request_id: int, x) -> bytes:
    if route.input.format == "raw":
        return x.astype("<f4").tobytes()
    return json.dumps({"id": request_id, "data": x.tolist()}).encode()


@pytest.mark.parametrize("route_name", ["gunpoint", "activity-raw", "load", "load-profile"])
def test_the_naive_script_answers_any_bundled_route_as_the_daemon_does(route_name):
    """json and raw input; classify, anomaly and values output: the naive reply carries the daemon's answer."""
    config = load_config(ROOT / "config.yaml")
    route = find_route(config, route_name)
    model = Model(config.models[route.model].path)
    pipe = route_pipeline(config, route, model)
    _, answer = make_answer(ROOT / "config.yaml", route_name)
    with np.load(config.models[route.model].path.parent / "test.npz") as data:
        samples = data["x"][:5].astype(np.float32)
    for k, x in enumerate(samples):
        payload = _payload(route, k, x)
        naive = json.loads(answer(payload))
        daemon = handle(pipe, payload, model, None, time.monotonic(), time.monotonic)
        assert naive["id"] == (k if route.input.format == "json" else None)
        if route.kind == "classify":
            assert naive["label"] == daemon["label"] and naive["score"] == pytest.approx(daemon["score"], abs=1e-6)
        elif route.kind == "anomaly":
            assert naive["anomaly_score"] == pytest.approx(daemon["anomaly_score"], abs=1e-6)
        else:
            assert naive["values"] == pytest.approx([v for vs in daemon["values"].values() for v in vs], abs=1e-6)



def test_naive_audio_answers_each_streamed_window_as_the_chain_does_on_it_whole(tmp_path):
    """80 ms pcm16 chunks of two microphones, interleaved: every 0.25 s once 2 s are there, one reply
    per window, numbered per microphone, scoring as the three models do on that window directly."""
    rate, chunk, window, hop = 16_000, 1280, 32_000, 4_000
    raw = yaml.safe_load(chain_config(tmp_path).read_text())
    raw["routes"][0].update(subscribe="mic/+/pcm", input={"format": "pcm16", "sample_rate": rate, "shape": [window],
                                                          "stream": {"hop": hop}},
                            preprocess=[{"normalize": {"std": 1 / 32768}}])
    path = tmp_path / "stream.yaml"
    path.write_text(yaml.safe_dump(raw))
    _, answer = make_audio_answer(path, "wake")
    signals = {d: np.round(np.random.default_rng(seed).standard_normal(37 * chunk) * 2000).astype(np.int16)
               for seed, d in enumerate(("a", "b"))}
    replies = {d: [] for d in signals}
    for i in range(0, 37 * chunk, chunk):
        for d, signal in signals.items():
            replies[d] += [json.loads(r) for r in answer(signal[i:i + chunk].astype("<i2").tobytes(), f"mic/{d}/pcm")]
    for d, signal in signals.items():
        assert [r["window"] for r in replies[d]] == [0, 1, 2, 3]  # (37 x 1280 - 32000) // 4000 + 1
        for r in replies[d]:
            start = r["window"] * hop
            direct = direct_scores(signal[start:start + window].astype(np.float32))[2].max()
            assert r["stream"] == d and abs(r["score"] - direct) < SCORE_TOLERANCE
