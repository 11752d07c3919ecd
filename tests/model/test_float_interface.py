"""An INT8 model with a float32 interface (QUANTIZE and DEQUANTIZE inside the graph: the TFLite
converter's default without inference_input_type) is served like its int8-interface twin."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import yaml

from daemon.config.loader import load_config
from daemon.model.runtime import Model
from daemon.pipeline.evaluate import validate
from daemon.pipeline.request_path import handle_batch
from daemon.pipeline.route_pipeline import Request, route_pipeline

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests/fixtures/activity_float_io"


def _config(tmp_path: Path) -> Path:
    raw = yaml.safe_load((ROOT / "config.yaml").read_text())
    route = next(r for r in raw["routes"] if r["name"] == "activity")
    route.pop("validate")
    raw["models"] = {"activity": {"path": str(FIXTURE / "model.tflite"), "labels": str(FIXTURE / "labels.txt")}}
    raw["routes"] = [route]
    raw["cache"] = {"dir": str(tmp_path / "cache")}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_the_float_interface_model_loads_with_float_tensors_and_int8_inside():
    model = Model(FIXTURE / "model.tflite", max_batch=8)
    assert model.input.dtype == np.float32 and model.output.dtype == np.float32 and not model.input.quantized
    assert model.interface.quantized_tensors > 0 and model.batchable


def test_it_answers_as_its_int8_interface_twin_on_every_held_out_window(tmp_path):
    config = load_config(_config(tmp_path))
    with np.load(ROOT / "models/activity/test.npz") as data:
        x, y = data["x"], data["y"]
    report, ok = validate(config, "activity", ROOT / "models/activity/test.npz")
    assert ok and report["accuracy"] == 1.0 and report["n"] == len(y)
    twin_config = load_config(ROOT / "config.yaml")
    route = config.routes[0]
    float_io, int8_io = Model(config.models["activity"].path), Model(twin_config.models["activity"].path)
    payloads = [f'{{"id": {i}, "data": {w.tolist()}}}'.encode() for i, w in enumerate(x)]
    now = time.monotonic()
    replies = {}
    for name, model, cfg in (("float", float_io, config), ("int8", int8_io, twin_config)):
        pipe = route_pipeline(cfg, route if name == "float" else twin_config.routes[0], model)
        outcome = handle_batch(pipe, [Request(p, now) for p in payloads], model, None, time.monotonic)
        replies[name] = [(r["id"], r["label"], r["top_k"]) for r in outcome.replies]
    assert replies["float"] == replies["int8"]  # the same int8 weights: the same answers, scores and all

