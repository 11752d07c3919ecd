"""Sub-labels on a real broker: the real SSD detector finds the cat in a real photo, and the real
EfficientNet classifier, run on that box's crop by the detect route's `then`, names its breed in
the same reply. The expected breed is not written here: it is what the classify route answers
for the crop this test cuts itself from the photo, sent to it over the same broker.

No fake anything: mosquitto, the daemon as a child process, the pretrained models and photos.
"""

from __future__ import annotations

import io
import math
import subprocess
import sys

import yaml
from PIL import Image

from tests.integration.conftest import Client
from tests.real_models import real_model

CAT_BREEDS = {"tabby", "tiger cat", "Persian cat", "Siamese cat", "Egyptian cat"}  # ImageNet's domestic cats
COCO_CAT = 16
PAD = 0.1
STATS = "edge-inferd/edge-inferd/stats"


def _route(name: str, model: str, then: dict = None, **output) -> dict:
    shape = [300, 300, 3] if model == "ssd" else [224, 224, 3]
    route = {"name": name, "subscribe": f"{name}/+/png", "model": model, "publish": f"{name}/{{1}}/result",
             "input": {"format": "image", "shape": shape, "dtype": "uint8"}, "output": output}
    if then is not None:
        route["then"] = then
    return route


def _config(tmp_path, routes: list) -> object:
    raw = {"mqtt": {"broker": "localhost:1883", "client_id": "edge-inferd", "session_expiry_s": 0},
           "models": {"ssd": {"path": str(real_model("ssd_mobilenet_v2_coco_quant.tflite")),
                              "labels": str(real_model("coco_labels.txt"))},
                      "effnet": {"path": str(real_model("efficientnet_lite0_uint8.tflite")),
                                 "labels": str(real_model("efficientnet_lite0_labels.txt"))}},
           "routes": routes, "stats_interval_s": 0.1,
           "cache": {"dir": str(tmp_path / "cache")}, "workers": {"max": 1}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _crop_png(photo: str, box: dict, pad: float) -> bytes:
    """The box widened by `pad` of its size on each side, out to whole pixels and inside the photo,
    cut from the photo as stored: what the sub-model is meant to see."""
    img = Image.open(real_model(photo)).convert("RGB")
    w, h = box["x_max"] - box["x_min"], box["y_max"] - box["y_min"]
    region = (max(0, math.floor(box["x_min"] - pad * w)), max(0, math.floor(box["y_min"] - pad * h)),
              min(img.width, math.ceil(box["x_max"] + pad * w)), min(img.height, math.ceil(box["y_max"] + pad * h)))
    buf = io.BytesIO()
    img.crop(region).save(buf, format="PNG")
    return buf.getvalue()


def _ask(client: Client, route: str, payload: bytes, n: int) -> dict:
    topic = f"{route}/c1/result"
    client.publish(f"{route}/c1/png", payload)
    return client.wait_json(topic, n)[n - 1]


def test_the_cat_s_box_carries_the_breed_the_classifier_gives_its_crop(tmp_path, client: Client, start_daemon):
    routes = [_route("cam", "ssd", {"route": "breed", "crop": {"pad": PAD}}, kind="detect", min_score=0.5),
              _route("breed", "effnet", top_k=1)]
    routes[0]["cache"] = True  # the detector's outputs are cached; the sub-labels never are
    start_daemon(_config(tmp_path, routes), wait_online=client)
    for topic in ("cam/c1/result", "breed/c1/result", STATS):
        client.subscribe(topic)
    photo = real_model("chelsea.png").read_bytes()
    reply = _ask(client, "cam", photo, 1)
    [cat] = [d for d in reply["detections"] if d["index"] == COCO_CAT]
    direct = _ask(client, "breed", _crop_png("chelsea.png", cat["box"], PAD), 1)
    assert (cat["sub_label"], cat["sub_score"]) == (direct["label"], direct["score"]), (cat, direct)
    assert cat["sub_label"] in CAT_BREEDS, cat
    # The same photo again: once the cache has stored the detector's outputs, a hit still gets its crops classified.
    client.wait_json_until(STATS, lambda s: s["cache"]["refused"] >= 1)
    _ask(client, "cam", photo, 2)
    client.wait_json_until(STATS, lambda s: s["cache"]["entries"] >= 1)
    hit = _ask(client, "cam", photo, 3)
    assert hit["cached"] is True
    assert hit["detections"] == reply["detections"]  # sub_label and sub_score included
    stats = client.wait_json_until(STATS, lambda s: s["counts"].get("crops_classified.cam", 0) >= 3)
    assert stats["counts"]["crops_classified.cam"] == 3


def test_max_crops_and_min_score_choose_the_boxes_classified(tmp_path, client: Client, start_daemon):
    """coffee.png at output.min_score 0.2: a cup (0.93) and two dining tables (0.58, 0.27)."""
    routes = [_route("few", "ssd", {"route": "breed", "max_crops": 1}, kind="detect", min_score=0.2),
              _route("sure", "ssd", {"route": "breed", "min_score": 0.5}, kind="detect", min_score=0.2),
              _route("breed", "effnet", top_k=1)]
    start_daemon(_config(tmp_path, routes), wait_online=client)
    client.subscribe("few/c1/result")
    client.subscribe("sure/c1/result")
    photo = real_model("coffee.png").read_bytes()
    few, sure = _ask(client, "few", photo, 1)["detections"], _ask(client, "sure", photo, 1)["detections"]
    scores = [d["score"] for d in few]
    assert len(few) >= 3 and min(scores) < 0.5 < max(scores), few
    best = max(range(len(few)), key=lambda i: few[i]["score"])
    assert [d["sub_label"] is not None for d in few] == [i == best for i in range(len(few))], few
    assert isinstance(few[best]["sub_label"], str) and 0 < few[best]["sub_score"] <= 1, few
    assert [d["sub_label"] is not None for d in sure] == [d["score"] >= 0.5 for d in sure], sure
    assert all((d["sub_label"] is None) == (d["sub_score"] is None) for d in few + sure)


def test_a_then_naming_a_detect_route_is_refused_at_start(tmp_path):
    routes = [_route("cam", "ssd", {"route": "other"}, kind="detect"), _route("other", "ssd", kind="detect")]
    proc = subprocess.run([sys.executable, "-m", "daemon", "check-config", "--config", str(_config(tmp_path, routes))],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 78, proc.stderr
    assert "routes[0].then.route: route 'other' is output.kind detect; a sub-model must be classify" in proc.stderr
