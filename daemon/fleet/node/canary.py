"""The canary's verdict: the new release on live traffic against the previous one on the same node.

Pure: it reads two release windows (daemon/obs/model_watch.py) and the internal-error count
since the swap, and says `pass`, `fail` (with why) or `wait`. Judged:
- internal errors: their share of the new release's requests, at most `max_internal_rate`;
- latency: the model's CPU time per sample against the previous release's, both invoked in turn in
  this process when the canary starts, at most `max_latency_ratio` (canary_probe.py says why, and
  why not the live invokes: a busy machine must not roll back identical bytes nor pass a slower
  build). The live invokes' ratio (canary_cpu.py) is shown beside it, not judged;
- answers: PSI of the new release's answers against the previous release's last answers before
  the swap, per route, at most `max_psi` (judged once both have PSI_MIN_ANSWERS): top-1
  labels for a classifier (by name: the same model with its labels permuted answers differently), the score in bins cut at the previous answers' deciles for an
  anomaly route (the same measures as drift, docs/drift.md). A release that answers the same
  traffic differently (permuted labels, a shifted threshold) fails here, whatever its gate said.
A failure is judged as soon as it shows; a pass needs `duration_s` and `min_answers`. A check
that never reached its minimum (low traffic, or a canary resumed after a restart, which has no
previous window) does not hold a pass back: the pass says so (`not_judged`, and the reason).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from daemon.config.fleet import CanaryConfig
from daemon.fleet.node.canary_cpu import cpu_ratio
from daemon.fleet.node.canary_probe import Probe
from daemon.obs.drift import SCORE_BINS, psi
from daemon.obs.model_watch import ReleaseWindow

PASS, FAIL, WAIT = "pass", "fail", "wait"
# Answers of each release (per route) before their PSI is read: with 10 bins two samples of one
# distribution read about 9 * (1/n + 1/m), 0.09 at 200 and 200 (docs/drift.md).
PSI_MIN_ANSWERS = 200


@dataclass(frozen=True)
class Verdict:
    outcome: str
    reason: str
    figures: dict


def judge(config: CanaryConfig, new: ReleaseWindow, previous: ReleaseWindow, internal: int, elapsed_s: float,
          routes: Sequence[str], probe: Optional[Probe] = None) -> Verdict:
    """`internal`: the model's routes' `internal` replies since the swap; `routes`: those routes;
    `probe`: the releases invoked in turn (None: no copy of the previous release, after a restart)."""
    answers = new.seen
    figures: dict = {"answers": answers, "min_answers": config.min_answers, "elapsed_s": round(elapsed_s, 1),
                     "duration_s": config.duration_s}
    requests = answers + internal
    rate = internal / requests if requests else 0.0
    figures["internal_rate"] = round(rate, 4)
    if requests and rate > config.max_internal_rate:
        return Verdict(FAIL, f"{internal} of {requests} requests answered internal ({rate:.1%} > "
                       f"fleet.canary.max_internal_rate {config.max_internal_rate:.1%})", figures)
    ratio = probe.ratio if probe is not None else None
    live = cpu_ratio(new.invokes, previous.invokes).ratio
    figures.update(latency_ratio=None if ratio is None else round(ratio, 3),
                   latency_invokes=probe.pairs if probe is not None else 0,
                   live_latency_ratio=None if live is None else round(live, 3))
    if ratio is not None and ratio > config.max_latency_ratio:
        return Verdict(FAIL, f"CPU time per sample is {ratio:.2f}x the previous release's ({probe.new_us:.1f} us "
                       f"against {probe.previous_us:.1f}, {probe.pairs} invokes of each in turn; "
                       f"fleet.canary.max_latency_ratio {config.max_latency_ratio:g})", figures)
    by_route = {route: _route_answers(new, previous, route) for route in routes}
    judged = [(route, value) for route, (value, _, _) in by_route.items() if value is not None]
    worst = max(judged, key=lambda item: item[1]) if judged else None
    figures["psi"] = None if worst is None else round(worst[1], 4)
    if worst is not None and config.max_psi is not None and worst[1] > config.max_psi:
        return Verdict(FAIL, f"route {worst[0]!r}: its answers moved from the previous release's on the same "
                       f"traffic (PSI {worst[1]:.3f} > fleet.canary.max_psi {config.max_psi:g})", figures)
    figures["not_judged"] = _not_judged(probe, by_route, config.max_psi is not None)
    if elapsed_s >= config.duration_s and answers >= config.min_answers:
        unjudged = "; not judged: " + "; ".join(figures["not_judged"]) if figures["not_judged"] else ""
        return Verdict(PASS, f"{answers} answers in {elapsed_s:.0f} s{unjudged}", figures)
    return Verdict(WAIT, "watching", figures)


def _not_judged(probe: Optional[Probe], by_route: dict, psi_on: bool) -> list[str]:
    """What the canary has not judged yet, and how far each is from its minimum (the reported
    document's `canary.not_judged`, and a pass's reason)."""
    notes = []
    if probe is None:
        notes.append("latency: no copy of the previous release to invoke beside the new one (a canary "
                     "resumed after a restart)")
    elif probe.ratio is None:
        notes.append(f"latency: {probe.note}")
    for route, (value, after, before) in by_route.items():
        if value is None and psi_on:
            fewest = min(after, before)
            counted = (f"{fewest} of {PSI_MIN_ANSWERS} answers (new release {after}, previous {before})"
                       if fewest < PSI_MIN_ANSWERS else "no label or score to compare")
            notes.append(f"PSI of route {route!r}: {counted}")
    return notes


def _route_answers(new: ReleaseWindow, previous: ReleaseWindow, route: str) -> tuple[Optional[float], int, int]:
    """One route's PSI (None before both releases have PSI_MIN_ANSWERS), and each release's answers."""
    after, before = [a for a in new.answers if a[0] == route], [a for a in previous.answers if a[0] == route]
    return route_psi(after, before), len(after), len(before)


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
