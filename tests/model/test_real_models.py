"""Real pretrained models written by others, through the daemon's own code: check-config accepts
what it can serve and names the reason for what it cannot, and the pipeline's answers on real
photos equal a plain interpreter's on the same pixels (tests/model/test_real_models_reference.py
records what the models themselves say)."""

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
from daemon.errors import ConfigError
from daemon.model.runtime import BACKENDS, Model, resolve_backend
from daemon.pipeline import images
from daemon.pipeline.request_path import handle
from daemon.pipeline.route_pipeline import route_pipeline
from tests.fakes import DictCache
from tests.real_models import real_model

SSD = "ssd_mobilenet_v2_coco_quant.tflite"
EFFICIENTNET = "efficientnet_lite0_uint8.tflite"
COCO_PERSON, COCO_CAT, COCO_CUP, COCO_TABLE = 0, 16, 46, 66
IMAGENET_CATS = range(281, 286)
IMAGENET_ESPRESSO, IMAGENET_CUP = 967, 968


def _jpeg(name: str, quality: int = 90) -> bytes:
    buf = io.BytesIO()
    Image.open(real_model(name)).convert("RGB").save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def _config(tmp_path: Path, models: dict, routes: list) -> Path:
    raw = {"mqtt": {"broker": "localhost:1883"}, "models": models, "routes": routes,
           "cache": {"dir": str(tmp_path / "cache")}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _camera_config(tmp_path: Path, resize: str = "stretch", **output) -> Path:
    models = {"ssd": {"path": str(real_model(SSD)), "labels": str(real_model("coco_labels.txt")), "threads": 2},
              "effnet": {"path": str(real_model(EFFICIENTNET)),
                         "labels": str(real_model("efficientnet_lite0_labels.txt"))}}
    routes = [{"name": "cam", "subscribe": "cameras/+/jpeg", "model": "ssd", "publish": "results/{1}/objects",
               "input": {"format": "image", "shape": [300, 300, 3], "dtype": "uint8", "resize": resize},
               "output": {"kind": "detect", "min_score": 0.5, "max_results": 10, **output}},
              {"name": "what", "subscribe": "cameras/+/what", "model": "effnet", "publish": "results/{1}/what",
               "input": {"format": "image", "shape": [224, 224, 3], "dtype": "uint8"}}]
    return _config(tmp_path, models, routes)


def _reply(config_path: Path, route_name: str, payload: bytes) -> dict:
    config = load_config(config_path)
    route = next(r for r in config.routes if r.name == route_name)
    model = Model(config.models[route.model].path, num_threads=config.models[route.model].threads)
    return handle(route_pipeline(config, route, model), payload, model, None, time.monotonic(), time.monotonic)


def _reference(model_name: str, pixels: np.ndarray) -> list[np.ndarray]:
    """The plain interpreter's outputs on the same pixels (the runtime the daemon picks here:
    ai-edge-litert, or tflite-runtime on armv7, which has no litert)."""
    interpreter = importlib.import_module(BACKENDS[resolve_backend()]).Interpreter
    interp = interpreter(model_path=str(real_model(model_name)))
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], pixels[None].astype(np.uint8))
    interp.invoke()
    return [interp.get_tensor(d["index"]) for d in interp.get_output_details()]


def test_check_config_accepts_the_ssd_detector_and_the_uint8_classifier(tmp_path):
    config = load_config(_camera_config(tmp_path))
    assert [r.kind for r in config.routes] == ["detect", "classify"]
    assert config.models["ssd"].threads == 2


@pytest.mark.parametrize("photo, wanted", [("astronaut.png", COCO_PERSON), ("chelsea.png", COCO_CAT),
                                           ("coffee.png", COCO_CUP)])
@pytest.mark.parametrize("resize", ["stretch", "letterbox"])
def test_the_detector_finds_what_the_photo_shows_in_its_own_pixels(tmp_path, photo, wanted, resize):
    payload = _jpeg(photo)
    sent = Image.open(io.BytesIO(payload))
    reply = _reply(_camera_config(tmp_path, resize), "cam", payload)
    assert "error" not in reply and {"id", "route", "model", "model_sha256", "cached", "latency_ms"} <= set(reply)
    best = reply["detections"][0]
    assert best["index"] == wanted and best["score"] >= 0.5
    assert best["label"] == {COCO_PERSON: "person", COCO_CAT: "cat", COCO_CUP: "cup"}[wanted]
    box = best["box"]
    assert 0 <= box["x_min"] < box["x_max"] <= sent.width and 0 <= box["y_min"] < box["y_max"] <= sent.height
    # The subject fills much of each photo: its box covers a good part of the picture as sent.
    assert (box["x_max"] - box["x_min"]) * (box["y_max"] - box["y_min"]) > 0.1 * sent.width * sent.height


def test_the_detections_equal_a_plain_interpreter_on_the_same_pixels(tmp_path):
    payload = _jpeg("coffee.png")
    pixels, geometry = images.decode_image(payload, 300, 300, 3)
    boxes, classes, scores, count = _reference(SSD, pixels)
    keep = [i for i in np.argsort(-scores[0], kind="stable") if scores[0][i] >= 0.5][:10]
    reply = _reply(_camera_config(tmp_path), "cam", payload)
    assert [d["index"] for d in reply["detections"]] == [int(classes[0][i]) for i in keep]
    assert [d["score"] for d in reply["detections"]] == [round(float(scores[0][i]), 6) for i in keep]
    ymin, xmin, ymax, xmax = np.clip(boxes[0][keep[0]], 0.0, 1.0)
    x0, y0 = geometry.normalized_to_sent(xmin, ymin)
    x1, y1 = geometry.normalized_to_sent(xmax, ymax)
    assert reply["detections"][0]["box"] == {"x_min": round(x0, 1), "y_min": round(y0, 1),
                                              "x_max": round(x1, 1), "y_max": round(y1, 1)}


@pytest.mark.parametrize("photo, wanted", [("chelsea.png", IMAGENET_CATS),
                                           ("coffee.png", (IMAGENET_ESPRESSO, IMAGENET_CUP))])
def test_the_uint8_classifier_names_the_photo_as_a_plain_interpreter_does(tmp_path, photo, wanted):
    payload = _jpeg(photo)
    reply = _reply(_camera_config(tmp_path), "what", payload)
    assert reply["index"] in wanted
    pixels, _ = images.decode_image(payload, 224, 224, 3)
    (out,) = _reference(EFFICIENTNET, pixels)
    assert reply["index"] == int(np.argmax(out[0]))
    assert reply["score"] == pytest.approx((out[0].max() - 0) * 0.00390625, abs=1e-6)  # dequantized uint8


def test_a_detector_runs_at_batch_one_and_says_so():
    model = Model(real_model(SSD), max_batch=32)
    assert not model.batchable and model.buckets == (1,)
    assert len(model.outputs) == 4 and model.num_outputs == 20 * 4 + 20 + 20 + 1


@pytest.mark.parametrize("name, reason", [
    ("okay_nabu_stateful.tflite", "stateful streaming model (ASSIGN_VARIABLE, CALL_ONCE, READ_VARIABLE, VAR_HANDLE)"),
    ("ssd_mobilenet_v2_coco_quant_edgetpu.tflite", "edgetpu-custom-op"),
])
def test_check_config_names_why_a_model_cannot_be_served(tmp_path, name, reason):
    path = _config(tmp_path, {"m": {"path": str(real_model(name))}},
                   [{"name": "r", "subscribe": "a/+/b", "model": "m", "publish": "c/{1}",
                     "input": {"shape": [1]}, "output": {"kind": "values"}}])
    with pytest.raises(ConfigError) as err:
        load_config(path)
    (line,) = [e for e in err.value.errors if e.startswith("models.m.path:")]
    assert reason in line


def test_a_detector_on_a_classify_route_is_refused_with_the_kind_it_looks_like(tmp_path):
    path = _config(tmp_path, {"ssd": {"path": str(real_model(SSD)), "labels": str(real_model("coco_labels.txt"))}},
                   [{"name": "cam", "subscribe": "cameras/+/jpeg", "model": "ssd", "publish": "r/{1}",
                     "input": {"format": "image", "shape": [300, 300, 3], "dtype": "uint8"}}])
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert any("routes[0].output" in e and "looks like an SSD object detector" in e and "output.kind: detect" in e
               for e in err.value.errors), err.value.errors


def test_coco_labels_with_gaps_name_the_detector_classes():
    from daemon.config.model_files import read_labels

    labels = read_labels(real_model("coco_labels.txt"))
    assert labels.by_id and labels.count == 80 and len(labels.names) == 90
    assert (labels.name(0), labels.name(16), labels.name(46), labels.name(11)) == ("person", "cat", "cup", "11")
    assert labels.name(12) == "stop sign" and labels.name(95) == "95"


# Boxes drawn by hand on scikit-image's photos (x_min, y_min, x_max, y_max in their own pixels).
HAND_BOXES = {"astronaut.png": [(COCO_PERSON, (18, 12, 365, 512))],
              "chelsea.png": [(COCO_CAT, (0, 0, 400, 300))],
              "coffee.png": [(COCO_CUP, (170, 15, 410, 305)), (COCO_TABLE, (0, 0, 600, 400))]}


def test_validate_reports_a_detectors_precision_and_recall_on_hand_labelled_photos(tmp_path, capsys):
    from daemon import cli

    arrays, rows = {}, []
    for i, (photo, boxes) in enumerate(HAND_BOXES.items()):
        arrays[f"image_{i}"] = np.frombuffer(_jpeg(photo), dtype=np.uint8)
        rows += [(i, cls, *box) for cls, box in boxes]
    data = tmp_path / "photos.npz"
    np.savez(data, boxes=np.array(rows, dtype=np.float32), **arrays)
    with pytest.raises(SystemExit) as done:
        cli.main(["validate", "--config", str(_camera_config(tmp_path)), "--route", "cam", "--data", str(data)])
    assert done.value.code == 0
    report = __import__("json").loads(capsys.readouterr().out)
    assert (report["n"], report["boxes"]) == (3, 4)
    # The dining table under coffee.png's cup scores exactly the route's min_score, 0.500, on
    # ai-edge-litert 2.3 (x86-64) and 0.418 on tflite-runtime 2.14 (x86-64 and armv7 alike), so
    # whether that one box is found depends on the runtime: all 4 on litert, 3 on tflite-runtime.
    recall = 1.0 if resolve_backend() == "litert" else 0.75
    assert report["precision"] == 1.0 and report["recall"] == recall, report
    assert report["true_positives"] == round(report["recall"] * 4), report


@pytest.mark.parametrize("route_cache, cached_again", [(None, False), (True, True)])
def test_an_image_route_skips_the_cache_unless_told(tmp_path, route_cache, cached_again):
    path = _camera_config(tmp_path)
    if route_cache is not None:
        raw = yaml.safe_load(path.read_text())
        raw["routes"][0]["cache"] = route_cache
        path.write_text(yaml.safe_dump(raw))
    config = load_config(path)
    route = config.routes[0]
    assert route.uses_cache is bool(route_cache)
    model = Model(config.models["ssd"].path)
    pipe, cache, payload = route_pipeline(config, route, model), DictCache(), _jpeg("coffee.png")
    first = handle(pipe, payload, model, cache, time.monotonic(), time.monotonic)
    again = handle(pipe, payload, model, cache, time.monotonic(), time.monotonic)
    assert (first["cached"], again["cached"], bool(cache.rows)) == (False, cached_again, cached_again)
    assert again["detections"] == first["detections"]
