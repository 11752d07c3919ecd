#!/usr/bin/env python3
"""The cost of a sub-model per box (`then:` on a detect route): ms per reply with and without it.

    .venv/bin/python benchmarks/bench_sub_labels.py [--rounds 5] [--replies 20] [--models .cache/test-models]
        [--out /tmp/bench-sub-labels]

The worker's own path, in process (no broker, no threads): `request_path.handle_batch` on the
SSD MobileNet v2 detector (the camera route of docs/performance.md: 300x300x3 uint8, stretch,
`min_score: 0.5`), then, with `then`, `sub_labels.classify_boxes` on EfficientNet-Lite0
(224x224x3 uint8, pad 0.1). The photo is chelsea.png (one cat: one crop per reply) as sent
(a 451x300 PNG) and as a 1280x720 JPEG (quality 85), where decoding it again at full size for
the crop costs more than the detector's reduced-scale decode did. One request per batch, each
model at `threads: 1`.

Rounds alternate which variant goes first, so a drift of the machine's load falls on both; each
round times `--replies` replies of each variant in CPU time (`time.process_time`: every thread
of the process, the interpreters' included; wall time on a shared machine measures its
neighbours too). The table gives the median over rounds of CPU ms per reply (min-max), and the
sub-model's share: with minus without, within each round.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time
from pathlib import Path

import yaml
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from daemon.config.loader import load_config  # noqa: E402
from daemon.config.model_files import open_model  # noqa: E402
from daemon.pipeline import request_path, sub_labels  # noqa: E402
from daemon.pipeline.route_pipeline import Request, route_pipelines  # noqa: E402

JPEG_SIZE = (1280, 720)
JPEG_QUALITY = 85
MS = 1000.0


def _config(models: Path, out: Path) -> Path:
    image = {"format": "image", "dtype": "uint8"}
    raw = {"mqtt": {"broker": "localhost:1883"}, "cache": {"enabled": False, "dir": str(out / "cache")},
           "models": {"ssd": {"path": str(models / "ssd_mobilenet_v2_coco_quant.tflite"),
                              "labels": str(models / "coco_labels.txt")},
                      "effnet": {"path": str(models / "efficientnet_lite0_uint8.tflite"),
                                 "labels": str(models / "efficientnet_lite0_labels.txt")}},
           "routes": [{"name": "cam", "subscribe": "cam/+", "model": "ssd", "publish": "r/{1}",
                       "input": {**image, "shape": [300, 300, 3]}, "output": {"kind": "detect", "min_score": 0.5},
                       "then": {"route": "breed", "crop": {"pad": 0.1}}},
                      {"name": "breed", "subscribe": "breed/+", "model": "effnet", "publish": "b/{1}",
                       "input": {**image, "shape": [224, 224, 3]}}]}
    path = out / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _photos(models: Path) -> dict[str, bytes]:
    png = (models / "chelsea.png").read_bytes()
    buf = io.BytesIO()
    Image.open(io.BytesIO(png)).convert("RGB").resize(JPEG_SIZE).save(buf, format="JPEG", quality=JPEG_QUALITY)
    return {"png 451x300": png, f"jpeg {JPEG_SIZE[0]}x{JPEG_SIZE[1]}": buf.getvalue()}


def _time(pipe, models: dict, payload: bytes, replies: int, then: bool) -> float:
    """CPU ms per reply over `replies` replies, one request per batch."""
    started = time.process_time()
    for _ in range(replies):
        requests = [Request(payload, time.monotonic())]
        outcome = request_path.handle_batch(pipe, requests, models["ssd"], None, time.monotonic)
        if then:
            assert sub_labels.classify_boxes(pipe, requests, outcome, models["effnet"], time.monotonic) == 1
    return (time.process_time() - started) * MS / replies


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--replies", type=int, default=20)
    parser.add_argument("--models", type=Path, default=Path(os.environ.get("EDGE_INFERD_TEST_MODELS",
                                                                           ROOT / ".cache/test-models")))
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench-sub-labels"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    config = load_config(_config(args.models, args.out))
    models = {name: open_model(config, name, max_batch=1) for name in config.models}
    pipe = route_pipelines(config, models)[0]
    print("| photo | without then (CPU ms/reply) | with then (CPU ms/reply) | sub-model per box (CPU ms) |\n|---|---|---|---|")
    for name, payload in _photos(args.models).items():
        _time(pipe, models, payload, 2, True)  # warm: arenas, caches
        runs: dict[bool, list[float]] = {False: [], True: []}
        for r in range(args.rounds):
            for then in ((False, True) if r % 2 == 0 else (True, False)):
                runs[then].append(_time(pipe, models, payload, args.replies, then))
        cost = [b - a for a, b in zip(runs[False], runs[True])]  # the same round's two variants
        print(f"| {name} | {_spread(runs[False])} | {_spread(runs[True])} | {_spread(cost)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
