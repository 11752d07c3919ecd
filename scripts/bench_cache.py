#!/usr/bin/env python3
"""CPU cost of the result cache on the reply path: miss, hit, put (memory tier in front).

    .venv/bin/python scripts/bench_cache.py [--entries 20000]

Keys over a 50x6 int8 input (the activity model's), the LRU pre-filled with `--entries`
vectors, the real diskcache behind it (written behind, never read: invoke cost 0).
Best of 5 timeit repeats of wall time per call, and process CPU time over one run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import timeit
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from daemon.cache.result_cache import ResultCache
from daemon.cache.cache_key import make_key  # noqa: E402
from daemon.config.schema import CacheConfig  # noqa: E402

CALLS = 200_000
REPEATS = 5
SHA = "ab" * 32


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=20_000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    miss_input, hit_input = (rng.integers(-128, 128, (50, 6), dtype=np.int8) for _ in range(2))
    scores = rng.random(6).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        cache = ResultCache(CacheConfig(dir=Path(tmp) / "c"))
        cache.put_many([(make_key(SHA, rng.integers(-128, 128, (50, 6), dtype=np.int8)), scores)
                        for _ in range(args.entries)])
        cache.put_many([(make_key(SHA, hit_input), scores)])
        cache.flush(60.0)
        cases = {"make_key": lambda: make_key(SHA, miss_input),
                 "miss (key + get_many)": lambda: cache.get_many([make_key(SHA, miss_input)]),
                 "hit (key + get_many)": lambda: cache.get_many([make_key(SHA, hit_input)]),
                 "put_many (one item)": lambda: cache.put_many([("k", scores)])}
        for name, call in cases.items():
            wall = min(timeit.repeat(call, number=CALLS, repeat=REPEATS)) / CALLS
            start = time.process_time()
            for _ in range(CALLS):
                call()
            cpu = (time.process_time() - start) / CALLS
            print(f"{name:24s} {wall * 1e6:6.2f} us wall  {cpu * 1e6:6.2f} us CPU (all threads)")
        start = time.perf_counter()
        flushed = cache.flush(60.0)
        print(f"flush after the puts: {flushed} in {time.perf_counter() - start:.3f} s")
        print(cache.snapshot())
        cache.close()


if __name__ == "__main__":
    main()
