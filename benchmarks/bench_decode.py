#!/usr/bin/env python3
"""`input.decode: fast` against `exact` on real photos: the decode's time and what it moves in the answer.

    EDGE_INFERD_TEST_MODELS=.cache/test-models .venv/bin/python benchmarks/bench_decode.py [--repeat 50]

Each photo scikit-image ships (astronaut 512x512, chelsea 451x300, coffee 600x400) is saved as a
JPEG (quality 90) at its own size and scaled up to 1280 px wide (a camera frame), then decoded into
EfficientNet-Lite0's 224x224 (uint8, classify) and SSD MobileNet v2's 300x300 (uint8, detect)
both ways: `fast` is libjpeg's reduced-scale decode (Pillow's draft mode) where the JPEG is at
least twice the target, `exact` a full decode. For each it prints the decode's median wall time
and the largest difference between the two decodes' answers: EfficientNet's top-1 score (and
whether the top-1 class changed), the SSD's detection scores of 0.5 and more matched by class and IoU.
Both models come from scripts/fetch_test_models.sh. Rounds alternate fast and exact.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from daemon.model.runtime import Model  # noqa: E402
from daemon.pipeline.images import decode_image  # noqa: E402
from daemon.pipeline.postprocess import ModelOutputs  # noqa: E402

PHOTOS = ("astronaut.png", "chelsea.png", "coffee.png")
CAMERA_WIDTH = 1280
JPEG_QUALITY = 90
MIN_SCORE = 0.5  # the detect routes' default min_score
MATCH_IOU = 0.5


def _jpegs(cache: Path) -> dict[str, bytes]:
    out = {}
    for name in PHOTOS:
        img = Image.open(cache / name).convert("RGB")
        scaled = img.resize((CAMERA_WIDTH, round(img.height * CAMERA_WIDTH / img.width)), Image.BICUBIC)
        for label, picture in ((f"{name[:-4]} {img.width}x{img.height}", img),
                               (f"{name[:-4]} {scaled.width}x{scaled.height}", scaled)):
            buf = io.BytesIO()
            picture.save(buf, format="JPEG", quality=JPEG_QUALITY)
            out[label] = buf.getvalue()
    return out


def _timed(payload: bytes, side: int, draft: bool, repeat: int) -> tuple[np.ndarray, float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        pixels, _ = decode_image(payload, side, side, 3, draft=draft)
        times.append(time.perf_counter() - start)
    return np.array(pixels), statistics.median(times)


def _ssd_scores(model: Model, pixels: np.ndarray) -> list[tuple[int, float, np.ndarray]]:
    outputs = ModelOutputs.of(model.interface)  # the daemon's own reading of the SSD's four outputs
    row, ssd = model.infer(pixels[None].astype(np.float32))[0], outputs.ssd
    boxes, classes, scores = (outputs.part(row, i) for i in (ssd.boxes, ssd.classes, ssd.scores))
    return [(int(c), float(s), b) for b, c, s in zip(boxes, classes, scores) if s >= MIN_SCORE]


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    lo, hi = np.maximum(a[:2], b[:2]), np.minimum(a[2:], b[2:])
    inter = float(np.prod(np.clip(hi - lo, 0, None)))
    union = float(np.prod(a[2:] - a[:2]) + np.prod(b[2:] - b[:2])) - inter
    return inter / union if union > 0 else 0.0


def _ssd_diff(fast: list, exact: list) -> str:
    diffs, unmatched = [], 0
    for c, s, b in exact:
        match = [fs for fc, fs, fb in fast if fc == c and _iou(fb, b) >= MATCH_IOU]
        if match:
            diffs.append(abs(match[0] - s))
        else:
            unmatched += 1
    return f"{len(exact)} dets, max |d score| {max(diffs, default=0):.4f}, {unmatched} unmatched"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    cache = Path(os.environ.get("EDGE_INFERD_TEST_MODELS", ROOT / ".cache/test-models"))
    effnet = Model(cache / "efficientnet_lite0_uint8.tflite")
    ssd = Model(cache / "ssd_mobilenet_v2_coco_quant.tflite")
    print(f"{'photo (JPEG q90)':24} {'224 fast/exact ms':>18} {'EfficientNet top-1':>28} "
          f"{'300 fast/exact ms':>18}  SSD")
    for label, payload in _jpegs(cache).items():
        (f224, tf224), (e224, te224) = _timed(payload, 224, True, args.repeat), _timed(payload, 224, False, args.repeat)
        (f300, tf300), (e300, te300) = _timed(payload, 300, True, args.repeat), _timed(payload, 300, False, args.repeat)
        sf, se = (effnet.infer(p[None].astype(np.float32))[0] for p in (f224, e224))
        top = f"{abs(sf.max() - se.max()):.4f}" + (" (same class)" if sf.argmax() == se.argmax() else " (CLASS CHANGED)")
        print(f"{label:24} {tf224 * 1e3:8.2f} / {te224 * 1e3:6.2f}  {top:>28} {tf300 * 1e3:8.2f} / {te300 * 1e3:6.2f}  "
              f"{_ssd_diff(_ssd_scores(ssd, f300), _ssd_scores(ssd, e300))}")


if __name__ == "__main__":
    main()
