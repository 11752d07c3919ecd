"""The live invokes' CPU time per sample, new release against previous: shown beside the canary's
judged latency (`live_latency_ratio`), not judged.

The judged ratio comes from both releases invoked in turn (canary_probe.py, which says why: on a
busy box this one squeezes a five-fold build towards 1, since a served invoke pays the machine's
cache refills, a fixed cost per invoke). This one is what the served traffic cost, per batch size:
a sample costs less in a larger batch (activity: 12 us alone, 6.9 us each in a batch of 8) and a
busy node batches more, so for each batch size that both releases ran at least BUCKET_MIN_INVOKES
times, the ratio of the releases' low quantile (QUANTILE) of CPU time per sample; the ratios are
averaged (geometrically) weighted by the invokes they compare. A low quantile: what lifts an
invoke above the model's own cost is the machine (an interrupt, caches gone cold while the
worker slept, a core clocked down while idle).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

# Invokes compared before a ratio is shown (summed over the batch sizes).
LATENCY_MIN_INVOKES = 100
# Invokes of one batch size in each release before that size takes part: a quantile of fewer is one
# or two invokes' worth.
BUCKET_MIN_INVOKES = 10
# The quantile of CPU time per sample compared, per batch size.
QUANTILE = 0.1


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
