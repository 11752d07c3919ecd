"""The naive scripts (`python -m daemon.tools.baselines naive` and `naive-detect`) do what the daemon does."""

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
from daemon.tools.baselines import make_answer, make_detect_answer
from tests.integration.conftest import ROOT
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

