"""The canary's latency measure: both releases' models side by side in this node's process, invoked
in turn, their CPU time per sample compared in the same seconds.

How: when a canary starts, the node holds a copy of the previous release's model (loaded from its
bytes before the swap) and one of the new release's. It invokes them in turn, the order swapped
each pair, on the model's own input of zeros at its native batch size, up to PAIRS pairs or
BUDGET_S of the wall clock, and compares the QUANTILE of each release's CPU time per sample
(`Model.cpu_invoke`, the calling thread's clock). The verdict (canary.py) reads the ratio.

Why not the live invokes' CPU time (what the canary read before): under contention it squeezes.
A served invoke comes after its worker slept, so it meets caches that the machine's other work
has filled, and that refill is a fixed cost per invoke that weighs as much on a small model as on
one five times its size. On this project's 2-core VM, three daemons with a busy loop per core, a
build doing the activity graph five times (tools/slower_build.py, 3.4x alone) read 1.91-2.47x
there (one node in 5 of 11 runs kept it under `max_latency_ratio` 2), and 4x longer canaries did
not help (2.09-2.22x). Back to back, each invoke meets the caches the last one left, and the two
releases meet the same machine because they take turns: the five-fold build reads 3.98-4.12x
(tests/fleet/node/test_canary_probe.py), quiet or with up to four busy loops per core, and
identical bytes 0.9-1.1x.

What it does not see, and is said in docs/fleet.md: a cost that depends on the input (zeros make
few boxes for a detector's post-processing), and one at other batch sizes than the model's native.
What it costs: PAIRS x 2 invokes once per canary (the activity model: about 20 ms), at most about
BUDGET_S for a large model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional, Protocol

import numpy as np

# Pairs of invokes (one of each release) at most.
PAIRS = 200
# Wall-clock seconds the probe may take: a model of 100 ms an invoke gets 10 pairs.
BUDGET_S = 2.0
# Pairs below which no ratio is judged (a model slower than BUDGET_S / 2 an invoke).
MIN_PAIRS = 3
# The quantile of each release's CPU time per sample: the invokes that met a warm core.
QUANTILE = 0.1


class Probed(Protocol):
    """What the probe needs of a loaded model (daemon/model/runtime.py's Model)."""

    input: object

    def cpu_invoke(self, q: np.ndarray) -> float: ...


@dataclass(frozen=True)
class Probe:
    ratio: Optional[float]
    """The new release's CPU time per sample over the previous one's; None below MIN_PAIRS."""
    pairs: int
    new_us: float
    previous_us: float
    """Each release's QUANTILE of CPU time per sample, microseconds (nan below MIN_PAIRS)."""
    note: str = ""
    """Why there is no ratio."""


def paired(previous: Probed, new: Probed, pairs: int = PAIRS, budget_s: float = BUDGET_S,
           clock: Callable[[], float] = time.monotonic) -> Probe:
    models = (previous, new)
    inputs = [np.zeros(model.input.shape, model.input.dtype) for model in models]
    batches = [max(1, int(model.input.shape[0])) for model in models]
    times: tuple[list[float], list[float]] = ([], [])
    started = clock()
    for i in range(pairs):
        for k in ((0, 1) if i % 2 == 0 else (1, 0)):
            times[k].append(models[k].cpu_invoke(inputs[k]) / batches[k])
        if clock() - started > budget_s:
            break
    done = len(times[1])
    if done < MIN_PAIRS:
        return Probe(None, done, float("nan"), float("nan"),
                     f"{done} pairs of invokes in {budget_s:g} s, fewer than {MIN_PAIRS}")
    before, after = (float(np.quantile(t, QUANTILE)) for t in times)
    ratio = after / before if before > 0 else None
    return Probe(ratio, done, after * 1e6, before * 1e6, "" if ratio else "the previous release's invokes took no time")


def copy_of(opener: Callable[[], Probed]) -> Probed | Probe:
    """A release's model loaded for the probe, or a Probe saying why it could not be."""
    try:
        return opener()
    except Exception as exc:  # noqa: BLE001 - any failure to load leaves latency unjudged, said
        return Probe(None, 0, float("nan"), float("nan"), f"the model could not be loaded for the probe: {exc}")


def against(previous: Probed | Probe, open_new: Callable[[], Probed]) -> Probe:
    """The probe of the new release (loaded now, after the swap) against the previous one's copy."""
    if isinstance(previous, Probe):
        return previous
    new = copy_of(open_new)
    return new if isinstance(new, Probe) else paired(previous, new)
