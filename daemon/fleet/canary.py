"""The canary's verdict: the new release on live traffic against the previous one on the same node.

Pure: it reads two release windows (daemon/obs/model_watch.py) and the internal-error count
since the swap, and says `pass`, `fail` (with why) or `wait`. Judged:
- internal errors: their share of the new release's requests, at most `max_internal_rate`;
- invoke time: the p99 per sample against the previous release's, at most `max_latency_ratio`
  (judged once both have LATENCY_MIN_SAMPLES batches);
- answers: PSI of the new release's answers against the previous release's last answers before
  the swap, per route, at most `max_psi` (judged once both have PSI_MIN_ANSWERS): top-1
  labels for a classifier (by name: the same model with its labels permuted answers differently), the score in bins cut at the previous answers' deciles for an
  anomaly route (the same measures as drift, docs/drift.md). A release that answers the same
  traffic differently (permuted labels, a shifted threshold) fails here, whatever its gate said.
A failure is judged as soon as it shows; a pass needs `duration_s` and `min_answers`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from daemon.config.fleet import CanaryConfig
from daemon.obs.drift import SCORE_BINS, psi
from daemon.obs.model_watch import ReleaseWindow

PASS, FAIL, WAIT = "pass", "fail", "wait"
# Batches of each release before their invoke p99s are compared: a p99 of fewer is one or two
# batches that met a busy core (seen: 5x on a loaded 2-core gateway between two builds of a model
# whose invokes, alone, differ by 0.7x).
LATENCY_MIN_SAMPLES = 200
# Answers of each release (per route) before their PSI is read: with 10 bins two samples of one
# distribution read about 9 * (1/n + 1/m), 0.09 at 200 and 200 (docs/drift.md).
PSI_MIN_ANSWERS = 200
P99 = 99


@dataclass(frozen=True)
class Verdict:
    outcome: str
    reason: str
    figures: dict


def judge(config: CanaryConfig, new: ReleaseWindow, previous: ReleaseWindow, internal: int, elapsed_s: float,
          routes: Sequence[str]) -> Verdict:
    """`internal`: the model's routes' `internal` replies since the swap; `routes`: those routes."""
    answers = new.seen
    figures: dict = {"answers": answers, "min_answers": config.min_answers, "elapsed_s": round(elapsed_s, 1),
                     "duration_s": config.duration_s}
    requests = answers + internal
    rate = internal / requests if requests else 0.0
    figures["internal_rate"] = round(rate, 4)
    if requests and rate > config.max_internal_rate:
        return Verdict(FAIL, f"{internal} of {requests} requests answered internal ({rate:.1%} > "
                       f"fleet.canary.max_internal_rate {config.max_internal_rate:.1%})", figures)
    ratio = latency_ratio(new.invoke_s, previous.invoke_s)
    figures["latency_ratio"] = None if ratio is None else round(ratio, 3)
    if ratio is not None and ratio > config.max_latency_ratio:
        return Verdict(FAIL, f"invoke p99 is {ratio:.2f}x the previous release's (fleet.canary.max_latency_ratio "
                       f"{config.max_latency_ratio:g})", figures)
    worst = worst_psi(new, previous, routes)
    figures["psi"] = None if worst is None else round(worst[1], 4)
    if worst is not None and config.max_psi is not None and worst[1] > config.max_psi:
        return Verdict(FAIL, f"route {worst[0]!r}: its answers moved from the previous release's on the same "
                       f"traffic (PSI {worst[1]:.3f} > fleet.canary.max_psi {config.max_psi:g})", figures)
    if elapsed_s >= config.duration_s and answers >= config.min_answers:
        return Verdict(PASS, f"{answers} answers in {elapsed_s:.0f} s", figures)
    return Verdict(WAIT, "watching", figures)


def latency_ratio(new: Sequence[float], previous: Sequence[float]) -> Optional[float]:
    if len(new) < LATENCY_MIN_SAMPLES or len(previous) < LATENCY_MIN_SAMPLES:
        return None
    before = float(np.percentile(previous, P99))
    return float(np.percentile(new, P99)) / before if before > 0 else None


def worst_psi(new: ReleaseWindow, previous: ReleaseWindow, routes: Sequence[str]) -> Optional[tuple[str, float]]:
    """(route, PSI) of the route whose answers moved most; None before any route has enough."""
    worst = None
    for route in routes:
        value = route_psi([a for a in new.answers if a[0] == route], [a for a in previous.answers if a[0] == route])
        if value is not None and (worst is None or value > worst[1]):
            worst = (route, value)
    return worst


def route_psi(new: list, previous: list) -> Optional[float]:
    """PSI of one route's answers (route, label, score): top-1 labels, else scores in deciles."""
    if len(new) < PSI_MIN_ANSWERS or len(previous) < PSI_MIN_ANSWERS:
        return None
    if all(a[1] is not None for a in new + previous):  # a classifier's top-1 answers, by label
        labels = sorted({str(a[1]) for a in new + previous})
        return psi(_counts([str(a[1]) for a in previous], labels), _counts([str(a[1]) for a in new], labels))
    before = np.asarray([a[2] for a in previous if not math.isnan(a[2])])
    after = np.asarray([a[2] for a in new if not math.isnan(a[2])])
    if len(before) < PSI_MIN_ANSWERS or len(after) < PSI_MIN_ANSWERS:
        return None  # a detector's or values route: no score to compare
    edges = np.unique(np.quantile(before, np.arange(1, SCORE_BINS) / SCORE_BINS))
    bins = len(edges) + 1
    return psi(np.bincount(np.searchsorted(edges, before, side="right"), minlength=bins),
               np.bincount(np.searchsorted(edges, after, side="right"), minlength=bins))


def _counts(values: list, labels: list) -> list[int]:
    where = {label: i for i, label in enumerate(labels)}
    counts = [0] * len(labels)
    for value in values:
        counts[where[value]] += 1
    return counts
