#!/usr/bin/env python3
"""Decode cost per JSON request in a worker's group: bytes -> the group's float32 array, GC on.

    .venv/bin/python scripts/profile_decode.py [--group 32] [--repeat 5]

Three shapes: the bundled `activity` ([100, 6] nested), a [150, 1] nested stream (`[[v], [v], ...]`)
and the bundled `appliance` ([1460] flat). The group goes through `codecs.decode_many` where the
tree has it, else through `codecs.decode` one by one and `np.stack` (the code before it).
Garbage collection stays on (timeit turns it off by default): holding a group's parsed lists
costs gen-0 collections, and those belong in the figure.
EDGE_INFERD_ROOT=/another/checkout measures another tree's code.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import timeit
from pathlib import Path

import numpy as np

ROOT = Path(os.environ.get("EDGE_INFERD_ROOT") or Path(__file__).resolve().parents[1])
sys.path.insert(0, str(ROOT))

from daemon.config.schema import InputConfig  # noqa: E402
from daemon.pipeline import codecs  # noqa: E402

SHAPES = {"activity [100][6]": (100, 6), "stream [150][1]": (150, 1), "appliance [1460]": (1460,)}


def _group(payloads: list[bytes], spec: InputConfig) -> np.ndarray:
    if hasattr(codecs, "decode_many"):
        return codecs.decode_many(payloads, spec).x
    return np.stack([codecs.decode(p, spec, check_finite=False).data for p in payloads])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--group", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--number", type=int, default=100)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    out = {"root": str(ROOT)}
    for name, shape in SHAPES.items():
        spec = InputConfig(format="json", shape=shape, max_bytes=1 << 20)
        payloads = [json.dumps({"id": i, "data": rng.normal(size=shape).tolist()}).encode()
                    for i in range(args.group)]
        timer = timeit.Timer(lambda: _group(payloads, spec), setup="gc.enable()", globals={"gc": gc})
        best = min(timer.repeat(number=args.number, repeat=args.repeat)) / args.number
        out[name] = round(best / args.group * 1e6, 2)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
