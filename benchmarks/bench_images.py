#!/usr/bin/env python3
"""Decode + resize cost per camera frame (daemon/pipeline/images.py), CPU and wall time.

    .venv/bin/python benchmarks/bench_images.py [--frames 300] [--photo PATH]

A 640x480 JPEG (quality 85) into 300x300 stretched and 320x320 letterboxed, and a 1920x1080
JPEG into 300x300 with libjpeg's reduced-scale decode (draft) and without. The frames are
made from `--photo` (any JPEG or PNG, cropped to 4:3 or 16:9 and resized) or, without one,
from a smooth gradient plus noise. A photo scaled up to 1080p is smoother than a real
1080p frame and so decodes a little faster. Each frame's CPU (time.process_time) and wall
time (time.perf_counter) are taken on their own; the table gives the median and the mean
in microseconds per frame.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from daemon.config.schema import LETTERBOX, STRETCH  # noqa: E402
from daemon.pipeline.images import decode_image  # noqa: E402

JPEG_QUALITY = 85
WARMUP_FRAMES = 10  # first calls import plugins and warm libjpeg's tables
NOISE_SIGMA = 6.0  # grey levels: sensor-like grain, so the synthetic frame is not trivially compressible
SEED = 0
VGA, FULL_HD = (640, 480), (1920, 1080)
# (label, source size, model input (width, height), resize, draft)
CASES = (
    ("640x480 -> 300x300 stretch", VGA, (300, 300), STRETCH, True),
    ("640x480 -> 320x320 letterbox", VGA, (320, 320), LETTERBOX, True),
    ("1920x1080 -> 300x300 stretch, draft", FULL_HD, (300, 300), STRETCH, True),
    ("1920x1080 -> 300x300 stretch, no draft", FULL_HD, (300, 300), STRETCH, False),
)


def _synthetic(size: tuple[int, int]) -> Image.Image:
    width, height = size
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    smooth = np.stack([xx / width * 255, yy / height * 255, (xx + yy) / (width + height) * 255], axis=-1)
    grain = np.random.default_rng(SEED).normal(0.0, NOISE_SIGMA, smooth.shape)
    return Image.fromarray(np.clip(smooth + grain, 0, 255).astype(np.uint8))


def _frame(photo: Path | None, size: tuple[int, int]) -> bytes:
    """A JPEG of exactly `size`: the photo cropped to its aspect and resized, or synthetic."""
    if photo is None:
        picture = _synthetic(size)
    else:
        with Image.open(photo) as source:
            picture = ImageOps.fit(source.convert("RGB"), size, Image.Resampling.LANCZOS)
    buf = io.BytesIO()
    picture.save(buf, "JPEG", quality=JPEG_QUALITY)
    return buf.getvalue()


def _measure(payload: bytes, target: tuple[int, int], resize: str, draft: bool,
             frames: int) -> tuple[list[float], list[float]]:
    """CPU and wall seconds of each of `frames` decodes, after a warm-up."""
    width, height = target
    for _ in range(WARMUP_FRAMES):
        decode_image(payload, height, width, 3, resize, draft=draft)
    cpu, wall = [], []
    for _ in range(frames):
        cpu0, wall0 = time.process_time(), time.perf_counter()
        decode_image(payload, height, width, 3, resize, draft=draft)
        cpu.append(time.process_time() - cpu0)
        wall.append(time.perf_counter() - wall0)
    return cpu, wall


def _us(seconds: list[float]) -> str:
    return f"{statistics.median(seconds) * 1e6:>9.0f} {statistics.fmean(seconds) * 1e6:>9.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=300, help="timed frames per case (default 300)")
    parser.add_argument("--photo", type=Path, help="a JPEG or PNG to make the frames from (default: synthetic)")
    args = parser.parse_args()
    if args.frames < 1:
        parser.error("--frames must be at least 1")
    payloads = {size: _frame(args.photo, size) for size in (VGA, FULL_HD)}
    print(f"source: {args.photo or 'synthetic gradient + noise'}; JPEG quality {JPEG_QUALITY}; "
          f"{args.frames} frames per case; us per frame")
    print(f"{'case':<40} {'KB':>5} {'cpu p50':>9} {'cpu mean':>9} {'wall p50':>9} {'wall mean':>9}")
    for label, size, target, resize, draft in CASES:
        cpu, wall = _measure(payloads[size], target, resize, draft, args.frames)
        print(f"{label:<40} {len(payloads[size]) / 1024:>5.0f} {_us(cpu)} {_us(wall)}")


if __name__ == "__main__":
    main()
