"""The naive camera script (`python -m daemon.tools.baselines naive-detect`) does what the daemon does."""

from __future__ import annotations

import io
import json
import time

import yaml
from PIL import Image

from daemon.config.loader import load_config
from daemon.model.runtime import Model
from daemon.pipeline.request_path import handle
from daemon.pipeline.route_pipeline import route_pipeline
from daemon.tools.baselines import make_detect_answer
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
