"""A camera on a real broker: JPEGs of any size to a real daemon serving the real SSD detector.

Every frame gets one reply on its ResponseTopic with its CorrelationData: the objects it
shows, boxed in the frame's own pixels, or a clear error for a picture that is no picture
or claims more pixels than `input.max_pixels` (a decompression bomb is never decoded).
"""

from __future__ import annotations

import io
import json

import yaml
from PIL import Image

from tests.fakes import png_claiming
from tests.integration.conftest import Client
from tests.real_models import real_model

REPLIES = "me/replies"
COCO_PERSON, COCO_CAT, COCO_CUP = 0, 16, 46


def _config(tmp_path) -> object:
    raw = {"mqtt": {"broker": "localhost:1883", "client_id": "edge-inferd", "session_expiry_s": 0},
           "models": {"ssd": {"path": str(real_model("ssd_mobilenet_v2_coco_quant.tflite")),
                              "labels": str(real_model("coco_labels.txt"))}},
           "routes": [{"name": "cam", "subscribe": "cameras/+/jpeg", "model": "ssd", "publish": "results/{1}/objects",
                       "input": {"format": "image", "shape": [300, 300, 3], "dtype": "uint8", "resize": "letterbox",
                                 "max_pixels": 20_000_000},
                       "output": {"kind": "detect", "min_score": 0.5, "max_results": 5}}],
           "cache": {"dir": str(tmp_path / "cache")}, "workers": {"max": 2}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _jpeg(name: str, size: tuple[int, int]) -> bytes:
    buf = io.BytesIO()
    Image.open(real_model(name)).convert("RGB").resize(size).save(buf, format="JPEG", quality=85)
    return buf.getvalue()


def test_frames_of_any_size_are_answered_with_boxes_in_their_own_pixels(tmp_path, client: Client, start_daemon):
    start_daemon(_config(tmp_path), wait_online=client)
    client.subscribe(REPLIES)
    frames = {b"person-640": (_jpeg("astronaut.png", (640, 480)), COCO_PERSON, (640, 480)),
              b"cat-1280": (_jpeg("chelsea.png", (1280, 720)), COCO_CAT, (1280, 720)),
              b"cup-320": (_jpeg("coffee.png", (320, 480)), COCO_CUP, (320, 480)),
              b"bomb": (png_claiming(60_000, 60_000), None, None),
              b"garbage": (b"\xff\xd8 not a jpeg at all", None, None)}
    for corr, (payload, _, _) in frames.items():
        client.publish("cameras/door/jpeg", payload, response_topic=REPLIES, correlation=corr)
    replies = {m.properties.CorrelationData: json.loads(m.payload) for m in client.wait_count(REPLIES, len(frames))}
    assert set(replies) == set(frames)  # one reply each, none lost
    for corr, (_, wanted, size) in frames.items():
        reply = replies[corr]
        if wanted is None:
            continue
        best = reply["detections"][0]
        assert best["index"] == wanted, reply
        box = best["box"]
        assert 0 <= box["x_min"] < box["x_max"] <= size[0] and 0 <= box["y_min"] < box["y_max"] <= size[1]
    assert replies[b"bomb"]["error"]["code"] == "too_large" and "60000x60000" in replies[b"bomb"]["error"]["message"]
    assert replies[b"garbage"]["error"]["code"] == "bad_payload"
    assert all(r.get("id") is None for r in replies.values())  # image payloads carry no JSON id
