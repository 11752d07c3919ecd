"""The canary's latency measure: the new release's CPU time per sample against the previous release's.

What is compared, and why not the wall clock:
- each invoke's CPU time on the worker's own thread (`time.thread_time()` around `invoke()`,
  daemon/model/runtime.py). The invoke runs on the calling thread (litert with `threads: 1`: the
  process's CPU time over invokes is that thread's), and the clock stops while another process
  holds the core. The wall clock does not: three nodes on one 2-core machine gave byte-identical
  releases invoke-p99 ratios of 0.33-2.22 (4 rollbacks in about 30 canaries), and in
  tests/fleet/node/test_canary_cpu.py (a busy loop per core, on and off) 0.02-47x, 4 to 7 of 30 over 2;
- per batch size: a sample costs less in a larger batch (activity: 12 us alone, 6.9 us each in a
  batch of 8), and a busy node batches more, so a mix of sizes would read as a change of model.
  For each batch size that both releases ran at least BUCKET_MIN_INVOKES times, the ratio of the
  releases' low quantile (QUANTILE) of CPU time per sample; the ratios are averaged
  (geometrically) weighted by the invokes they compare;
- a low quantile, not the median: what lifts an invoke's CPU time above the model's own cost is
  the machine (an interrupt inside it, caches gone cold while the worker slept, a core clocked
  down while idle), and it lifts many invokes at a quiet, paced node. Measured, the activity model
  one invoke every 5 ms: its median 17-23 us against 11.4 back to back, its 10th percentile 17;
  the five-fold build's median 65-85 us, its 10th percentile 47-54. On three daemons the median
  read the five-fold build 2.09x once, next to the rollback line; the 10th percentile is the cost
  of an invoke that met a warm core, which the machine's state moves least.
What still moves it: the machine's other work slowing the core itself (a shared cache, a sibling
hyperthread of the host, the clock frequency). Measured there, 30 canaries a run: identical bytes
0.80-1.19x in two runs and 0.92-1.38x in a third with the machine's other users busy (load
average 5 on 2 cores), a build doing the activity graph five times with the same answers
(tools/slower_build.py; 3.4x alone at batch 1) 2.63-3.91x; on three daemons with a busy loop per
core during the canaries (tests/integration/test_fleet_rollout.py), 0.73-1.00x and 2.52-3.22x
in two runs, and 0.89-0.98x and 2.14-2.41x in a third at load average 5-8: the machine's own
work per invoke (cache refills after a switch) weighs more on the small model than on the build
five times its size, so a busy box squeezes the ratio towards 1. `max_latency_ratio` 2 rolls back
what costs about 3x and more there; a ratio much below 1.5 would roll back identical bytes.

With `threads` > 1 the calling thread's own share is measured (it works with the pool and then
waits); both releases run with the model's one `threads` setting, so like is compared with like.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

# Invokes compared before a ratio is judged (summed over the batch sizes). A quantile of CPU time
# per sample is steady long before a p99 is: medians of windows of 20, 100 and 1,000 invokes gave
# identical bytes the same spread (0.81-1.25x), the machine's, not the sample's.
LATENCY_MIN_INVOKES = 100
# Invokes of one batch size in each release before that size takes part: a quantile of fewer is one
# or two invokes' worth.
BUCKET_MIN_INVOKES = 10
# The quantile of CPU time per sample compared, per batch size.
QUANTILE = 0.1
BUCKET_MIN_INVOKES = 10


@dataclass(frozen=True)
class CpuRatio:
    ratio: Optional[float]
    """None until LATENCY_MIN_INVOKES are compared."""
    compared: int
    """Invokes compared: per batch size, the fewer of the two releases'."""
    new: int
    previous: int
    """Each release's invokes in its window."""


def cpu_ratio(new: Sequence[tuple[int, float]], previous: Sequence[tuple[int, float]]) -> CpuRatio:
    """The new release's CPU time per sample over the previous one's, from (batch size, CPU seconds
    per sample) per invoke (daemon/obs/model_watch.py)."""
    after, before = _by_size(new), _by_size(previous)
    logs, weights = [], []
    for size in sorted(after.keys() & before.keys()):
        n = min(len(after[size]), len(before[size]))
        then = float(np.quantile(before[size], QUANTILE))
        if n < BUCKET_MIN_INVOKES or then <= 0:
            continue
        logs.append(math.log(max(float(np.quantile(after[size], QUANTILE)), 1e-12) / then))
        weights.append(n)
    compared = sum(weights)
    ratio = None
    if compared >= LATENCY_MIN_INVOKES:
        ratio = math.exp(sum(w * x for w, x in zip(weights, logs)) / compared)
    return CpuRatio(ratio, compared, len(new), len(previous))


def _by_size(invokes: Sequence[tuple[int, float]]) -> dict[int, list[float]]:
    sizes: dict[int, list[float]] = defaultdict(list)
    for size, per_sample_s in invokes:
        sizes[size].append(per_sample_s)
    return sizes
