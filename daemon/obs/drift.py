"""Drift, watched: per route, a sliding window of the answers' distribution against a reference.

What is measured, by output kind:
- `classify`: the shares of the top-1 label, and a histogram of the top score (10 equal bins
  over 0..1, the range of a softmax; a score outside it falls in the end bin);
- `anomaly`: the anomaly score, in bins cut at the reference's deciles (each bin holds a tenth
  of the reference), and the window's quantiles (p50, p90, p99) beside the reference's;
- `detect` and `values`: nothing. A picture holds any number of boxes and a regressor's
  outputs have no fixed range or meaning to bin, so there is no one distribution to watch.

The reference is the route's `validate` data run through its pipeline at start-up or reload
(daemon/lifecycle/drift_reference.py), or else the route's first `drift.reference_answers`
answers; the window then holds the last `drift.window` answers after it.

The measure is the population stability index, PSI = sum over bins of (a - e) * ln(a / e),
a the window's share of a bin and e the reference's: the standard measure of model
monitoring (credit scoring first), symmetric, zero for equal distributions, with
conventional readings (below 0.1 stable, 0.1 to 0.25 a moderate shift, above 0.25 a
significant one). A bin empty on one side would make it infinite, so an empty bin's share
counts as PSI_EPSILON (1e-4, one answer in 10,000). With k bins, two samples of the same
distribution still read about (k - 1) * (1/n + 1/m) (n, m answers in window and reference):
0.03 for 10 bins and 1,000 vs 500 answers, 0.1 at 100 answers. Hence `drift.min_answers`:
no PSI is reported (null) before the window holds that many.

Cost: an answer updates two counts in a ring (`RouteDrift.observe`, a few µs under one lock
per batch); the PSI is computed only when the stats are read (`DriftMonitor.snapshot`, every
`stats_interval_s` and at each Prometheus scrape), and a warning is logged once per episode:
when a route's PSI first passes `drift.warn_above`, and one line when it is back below
WARN_RECOVER_FRACTION of it (a PSI hovering at the threshold does not log a pair a read).
"""

from __future__ import annotations

import bisect
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import numpy as np

from daemon.config.drift import DriftConfig
from daemon.config.schema import ANOMALY, CLASSIFY

logger = logging.getLogger(__name__)

# Share given to an empty bin, on either side, so that ln(a / e) stays finite.
PSI_EPSILON = 1e-4
# Bins of the score histogram (classify: equal widths over 0..1; anomaly: reference deciles).
SCORE_BINS = 10
CLASSIFY_SCORE_EDGES = tuple(i / SCORE_BINS for i in range(1, SCORE_BINS))  # inner bounds
# A warned route's episode ends when its PSI is below this fraction of `warn_above`.
WARN_RECOVER_FRACTION = 0.8
QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
MEASURED_KINDS = (CLASSIFY, ANOMALY)
FROM_VALIDATE, FROM_FIRST_ANSWERS = "validate", "first_answers"

Answer = tuple[str, Optional[int], float]  # (route, top-1 index or None for anomaly, score)


def psi(expected: Sequence[float], actual: Sequence[float], epsilon: float = PSI_EPSILON) -> float:
    """The population stability index of `actual` against `expected`, both counts (or shares)
    over the same bins; each side is normalised, and an empty bin's share counts as `epsilon`."""
    e = np.asarray(expected, dtype=np.float64)
    a = np.asarray(actual, dtype=np.float64)
    if e.sum() <= 0 or a.sum() <= 0:
        return 0.0
    e = np.maximum(e / e.sum(), epsilon)
    a = np.maximum(a / a.sum(), epsilon)
    return float(np.sum((a - e) * np.log(a / e)))


@dataclass(frozen=True)
class Reference:
    """A route's expected distribution: label counts (classify), the score bins' inner edges and
    counts, and the scores' quantiles (anomaly)."""

    source: str
    n: int
    score_edges: tuple[float, ...]
    score_counts: tuple[int, ...]
    label_counts: Optional[tuple[int, ...]] = None
    quantiles: Optional[Mapping[str, float]] = None

    @classmethod
    def of(cls, kind: str, scores: Sequence[float], indices: Optional[Sequence[int]] = None,
           n_labels: int = 0, source: str = FROM_VALIDATE) -> "Reference":
        """From answers: the top score and top-1 index of each (classify), or the anomaly score."""
        s = np.asarray(scores, dtype=np.float64)
        if kind == ANOMALY:
            edges = tuple(float(v) for v in np.unique(np.quantile(s, np.arange(1, SCORE_BINS) / SCORE_BINS)))
            quantiles = {name: float(np.quantile(s, q)) for name, q in QUANTILES} if s.size else None
            return cls(source, int(s.size), edges, _bin_counts(s, edges), None, quantiles)
        # intp, not int64: bincount casts its input to intp "safely", and on a 32-bit machine
        # (armv7, numpy 1.24) int64 does not cast to int32: the daemon failed at start-up there.
        labels = np.bincount(np.asarray(indices, dtype=np.intp), minlength=n_labels) if len(s) else \
            np.zeros(n_labels, dtype=np.int64)
        return cls(source, int(s.size), CLASSIFY_SCORE_EDGES, _bin_counts(s, CLASSIFY_SCORE_EDGES),
                   tuple(int(c) for c in labels))


def _bin_counts(scores: np.ndarray, edges: tuple[float, ...]) -> tuple[int, ...]:
    """Counts per bin, a value on an edge in the bin above it (as bisect_right in `observe`)."""
    bins = np.searchsorted(np.asarray(edges), scores, side="right")
    return tuple(int(c) for c in np.bincount(bins, minlength=len(edges) + 1))


class RouteDrift:
    """One route's reference (or the answers collected for it) and its window. Not locked:
    DriftMonitor locks it."""

    def __init__(self, kind: str, labels: Sequence[str], config: DriftConfig,
                 reference: Optional[Reference] = None):
        self.kind = kind
        self.labels = tuple(labels)
        self.config = config
        self.reference = reference
        self._collected: list[tuple[int, float]] = []  # toward a first-answers reference
        self.warned = False
        self._reset_window()

    def _reset_window(self) -> None:
        size = self.config.window
        self._edges = self.reference.score_edges if self.reference is not None else CLASSIFY_SCORE_EDGES
        self._ring_label = [0] * size
        self._ring_bin = [0] * size
        self._ring_score = [0.0] * size
        self._next = 0
        self.filled = 0
        self.label_counts: dict[int, int] = {}
        self.bin_counts = [0] * (len(self._edges) + 1)

    def observe(self, index: Optional[int], score: float) -> None:
        """One answer: its top-1 index (None for an anomaly score) and score."""
        if self.reference is None:
            self._collect(index, score)
            return
        label = -1 if index is None else index
        bin_ = bisect.bisect_right(self._edges, score)
        i = self._next
        if self.filled == self.config.window:  # the oldest answer leaves the window
            old = self._ring_label[i]
            self.label_counts[old] -= 1
            self.bin_counts[self._ring_bin[i]] -= 1
        else:
            self.filled += 1
        self._ring_label[i], self._ring_bin[i], self._ring_score[i] = label, bin_, score
        self.label_counts[label] = self.label_counts.get(label, 0) + 1
        self.bin_counts[bin_] += 1
        self._next = i + 1 if i + 1 < self.config.window else 0

    def _collect(self, index: Optional[int], score: float) -> None:
        self._collected.append((-1 if index is None else index, score))
        if len(self._collected) >= self.config.reference_answers:
            indices, scores = zip(*self._collected)
            self.reference = Reference.of(self.kind, scores, indices, len(self.labels), FROM_FIRST_ANSWERS)
            self._collected = []
            self._reset_window()

    def measures(self) -> Optional[dict[str, float]]:
        """PSI by measure ({labels, score} or {score}); None until the window holds min_answers."""
        if self.reference is None or self.filled < self.config.min_answers:
            return None
        out = {}
        if self.kind == CLASSIFY:
            expected = self.reference.label_counts or ()
            size = max(len(expected), max(self.label_counts, default=-1) + 1)
            actual = [self.label_counts.get(i, 0) for i in range(size)]
            out["labels"] = psi(list(expected) + [0] * (size - len(expected)), actual)
        out["score"] = psi(self.reference.score_counts, self.bin_counts)
        return out

    def state(self, measures: Optional[dict[str, float]]) -> dict[str, Any]:
        """The route's part of the stats' `drift`: window, reference, PSI, what is drifting."""
        ref = self.reference
        out: dict[str, Any] = {
            "kind": self.kind, "answers": self.filled, "window": self.config.window,
            "reference": ({"source": ref.source, "n": ref.n} if ref is not None else
                          {"source": FROM_FIRST_ANSWERS, "n": 0, "collected": len(self._collected),
                           "wanted": self.config.reference_answers}),
            "psi": measures, "psi_max": max(measures.values()) if measures else None, "drifting": self.warned,
        }
        if ref is None or not self.filled:
            return out
        out["score_shares"] = _shares(self.bin_counts)
        out["reference_score_shares"] = _shares(ref.score_counts)
        if self.kind == CLASSIFY:
            out["label_shares"] = {self._label(i): round(n / self.filled, 4)
                                   for i, n in sorted(self.label_counts.items()) if n}
            total = sum(ref.label_counts or ()) or 1
            out["reference_label_shares"] = {self._label(i): round(n / total, 4)
                                             for i, n in enumerate(ref.label_counts or ()) if n}
        else:
            scores = np.asarray(self._ring_score[: self.filled])
            out["score_quantiles"] = {name: float(np.quantile(scores, q)) for name, q in QUANTILES}
            out["reference_quantiles"] = dict(ref.quantiles or {})
        return out

    def _label(self, index: int) -> str:
        return self.labels[index] if 0 <= index < len(self.labels) else str(index)


def _shares(counts: Sequence[int]) -> list[float]:
    total = sum(counts) or 1
    return [round(c / total, 4) for c in counts]


@dataclass(frozen=True)
class RouteSpec:
    """What a route's drift state is made from; a reload keeps the state while this is equal."""

    name: str
    kind: str
    labels: tuple[str, ...]
    fingerprint: tuple  # (RouteConfig, model sha256, labels): a changed one starts afresh


class DriftMonitor:
    """Every measured route's drift, behind one lock: `observe` on the reply path (per batch),
    `snapshot` when the stats are read."""

    def __init__(self, config: DriftConfig):
        self.config = config
        self._lock = threading.Lock()
        self._routes: dict[str, RouteDrift] = {}
        self._specs: dict[str, RouteSpec] = {}

    def stale(self, config: DriftConfig, specs: Iterable[RouteSpec]) -> list[RouteSpec]:
        """The measured routes among `specs` whose state `configure(config, ...)` would start afresh."""
        if not config.enabled:
            return []
        with self._lock:
            same = config == self.config
            return [s for s in specs if s.kind in MEASURED_KINDS and not (same and self._specs.get(s.name) == s)]

    def configure(self, config: DriftConfig, specs: Iterable[RouteSpec],
                  references: Mapping[str, Reference]) -> None:
        """The routes to watch (at start-up and each reload): a route whose spec and the drift
        settings are unchanged keeps its window; the others start with `references` (a route
        without one collects its first answers)."""
        specs = [s for s in specs if s.kind in MEASURED_KINDS] if config.enabled else []
        with self._lock:
            keep = config == self.config
            self.config = config
            routes = {}
            for s in specs:
                if keep and self._specs.get(s.name) == s:
                    routes[s.name] = self._routes[s.name]
                else:
                    routes[s.name] = RouteDrift(s.kind, s.labels, config, references.get(s.name))
            self._routes = routes
            self._specs = {s.name: s for s in specs}

    def observe(self, answers: Sequence[Answer]) -> None:
        """A batch's answers, under the lock once."""
        if not answers:
            return
        with self._lock:
            routes = self._routes
            for route, index, score in answers:
                drift = routes.get(route)
                if drift is not None:
                    drift.observe(index, score)

    def snapshot(self) -> dict[str, dict]:
        """{route: state}; computes the PSIs and logs a route's drift once per episode."""
        lines: list[Callable[[], None]] = []
        with self._lock:
            out = {}
            for name, drift in self._routes.items():
                measures = drift.measures()
                self._episode(name, drift, measures, lines)
                out[name] = drift.state(measures)
        for line in lines:
            line()
        return out

    def _episode(self, name: str, drift: RouteDrift, measures: Optional[dict[str, float]],
                 lines: list[Callable[[], None]]) -> None:
        """Start or end the route's warning episode; the line is logged after the lock is let go."""
        if not measures:
            return
        worst = max(measures, key=measures.__getitem__)
        value, limit = measures[worst], drift.config.warn_above
        if not drift.warned and value > limit:
            drift.warned = True
            lines.append(lambda: logger.warning(
                "drift on route %r: PSI %.3f of the %s over the last %d answers, above drift.warn_above %.2f "
                "(reference: %s, %d answers)", name, value, _measure_words(worst), drift.filled, limit,
                drift.reference.source, drift.reference.n))
        elif drift.warned and all(v < limit * WARN_RECOVER_FRACTION for v in measures.values()):
            drift.warned = False
            lines.append(lambda: logger.info("drift on route %r back below drift.warn_above: PSI %s",
                                             name, _psi_words(measures)))


def _measure_words(measure: str) -> str:
    return "top-1 label shares" if measure == "labels" else "score histogram"


def _psi_words(measures: Mapping[str, float]) -> str:
    return ", ".join(f"{key} {value:.3f}" for key, value in sorted(measures.items()))
