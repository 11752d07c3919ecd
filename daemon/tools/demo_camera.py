"""The demo's camera: the SSD detector and photos that scripts/fetch_test_models.sh fetches.

When they are in the cache (EDGE_INFERD_TEST_MODELS, else .cache/test-models in the checkout),
the demo serves a copy of its config with config.yaml's commented camera route on the SSD
added, and sends scikit-image's photos as JPEGs of a few sizes, each showing one object
it should find on top: a person, a cat, a cup.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Optional

import yaml
from PIL import Image

from daemon.config.loader import load_config
from daemon.config.reader import absolute_paths

ENV = "EDGE_INFERD_TEST_MODELS"
CHECKOUT = Path(__file__).resolve().parents[2]
SSD, COCO_LABELS = "ssd_mobilenet_v2_coco_quant.tflite", "coco_labels.txt"
# Photo, the object it shows (a COCO label), what it is.
PHOTOS = (("astronaut.png", "person", "astronaut"), ("chelsea.png", "cat", "chelsea"), ("coffee.png", "cup", "coffee"))
SIZES = ((640, 480), (1280, 720))
FILES = (SSD, COCO_LABELS, *(photo for photo, _, _ in PHOTOS))
_JPEG_QUALITY = 85


def models_dir() -> Path:
    """Where scripts/fetch_test_models.sh put the fetched models and photos."""
    return Path(os.environ.get(ENV) or CHECKOUT / ".cache" / "test-models").resolve()


def missing(cache: Path) -> list[str]:
    """The files the camera needs that `cache` lacks."""
    return [name for name in FILES if not (cache / name).is_file()]


def skip_reason(cache: Path) -> Optional[str]:
    """Why the demo leaves the camera out, in one line (None: it runs)."""
    lacking = missing(cache)
    if not lacking:
        return None
    what = "has none of the fetched models" if len(lacking) == len(FILES) else f"lacks {', '.join(lacking)}"
    return (f"skipped: {cache} {what} (the SSD detector and photos: ./scripts/fetch_test_models.sh "
            "fetches them, ./scripts/demo.sh runs it)")


def camera_route(name: str, model: str) -> dict:
    """config.yaml's commented camera route."""
    return {"name": name, "subscribe": "cameras/+/jpeg", "model": model,
            "input": {"format": "image", "shape": [300, 300, 3], "dtype": "uint8", "resize": "letterbox",
                      "max_pixels": 40_000_000},
            "output": {"kind": "detect", "min_score": 0.5, "max_results": 10},
            "publish": "results/{1}/objects"}


def _free(name: str, taken) -> str:
    while name in taken:
        name += "-demo"
    return name


def _paths_kept(raw: dict, config_path: Path) -> dict:
    """The config's relative paths made absolute as the daemon resolves them, so a copy written
    elsewhere uses the same model files, cache, outbox and credentials."""
    config = load_config(config_path, check_models=False)  # its paths only: the daemon checks the models
    absolute_paths(raw, config_path.resolve().parent)
    raw["cache"] = {**(raw.get("cache") or {}), "dir": str(config.cache.dir)}
    mqtt = raw["mqtt"] = raw.get("mqtt") or {}
    mqtt["outbox"] = {**(mqtt.get("outbox") or {}), "dir": str(config.mqtt.outbox.dir)}
    if mqtt.get("password_file"):
        mqtt["password_file"] = str(config.mqtt.password_file)
    for key in ("ca_file", "cert_file", "key_file"):
        if isinstance(mqtt.get("tls"), dict) and mqtt["tls"].get(key):
            mqtt["tls"][key] = str(getattr(config.mqtt.tls, key))
    return raw


def with_camera(config_path: Path, cache: Path, out_dir: Path) -> Path:
    """A copy of the config in `out_dir` that also serves the camera route on the fetched SSD
    (none added when it has a detect route already)."""
    raw = _paths_kept(yaml.safe_load(config_path.read_text(encoding="utf-8")), config_path)
    models, routes = raw.setdefault("models", {}), raw.setdefault("routes", [])
    if not any((r.get("output") or {}).get("kind") == "detect" for r in routes):
        model = _free("ssd", models)
        models[model] = {"path": str(cache / SSD), "labels": str(cache / COCO_LABELS), "threads": 2}
        routes.append(camera_route(_free("camera", {r.get("name") for r in routes}), model))
    path = out_dir / "config.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


def frames(cache: Path, limit: int = 0) -> tuple[list[bytes], list[str], list[str]]:
    """The JPEGs sent (every photo at each of SIZES in turn), the object each should show on top,
    and what each is ("astronaut 640x480"); the first `limit` when set."""
    photos = [(Image.open(cache / photo).convert("RGB"), label, what) for photo, label, what in PHOTOS]
    payloads, expected, names = [], [], []
    for width, height in SIZES:
        for image, label, what in photos:
            buf = io.BytesIO()
            image.resize((width, height)).save(buf, format="JPEG", quality=_JPEG_QUALITY)
            payloads.append(buf.getvalue())
            expected.append(label)
            names.append(f"{what} {width}x{height}")
    n = limit or len(payloads)
    return payloads[:n], expected[:n], names[:n]
