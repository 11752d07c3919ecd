"""Each model release's recent answers and invokes' CPU time, for the fleet canary (daemon/fleet/node/canary.py).

Keyed by the sha256 prefix that every result carries (`model_sha256`), so an answer is
credited to the release that made it even while a hot swap is under way (a batch in flight
finishes on the old model). What the canary compares: the new release's answers and the CPU
time of its invokes against the previous release's, on the same node's live traffic just before
the swap. An invoke is kept as (batch size, CPU seconds per sample): a sample costs less in a
larger batch, so the canary compares batch size with batch size (daemon/fleet/node/canary_cpu.py).

Cost, when the fleet is on: under one lock per batch, a deque append per answer and one per
invoke. Off (no fleet): nothing is built and the replier skips it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Optional, Sequence

# Answers and invokes kept per release: enough for a PSI over ten bins (docs/drift.md: two
# samples of one distribution read ~0.02 at 1,000 each) and a quantile per batch size.
WINDOW = 2000
# Releases watched at most (the current, the previous, and one swap in flight).
RELEASES = 4

# (model sha256 prefix, route, top-1 label (its index when unlabelled) or None, score)
WatchedAnswer = tuple[str, str, Optional[object], float]


@dataclass(frozen=True)
class ReleaseWindow:
    """A copy of one release's window: the answers (route, label, score) and the invokes
    (batch size, CPU seconds per sample)."""

    answers: tuple[tuple[str, Optional[object], float], ...]
    invokes: tuple[tuple[int, float], ...]
    seen: int
    """Answers seen since the window was made (more than it holds once it is full)."""


class _Window:
    def __init__(self) -> None:
        self.answers: deque = deque(maxlen=WINDOW)
        self.invokes: deque = deque(maxlen=WINDOW)
        self.seen = 0


class ModelWatch:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._windows: OrderedDict[str, _Window] = OrderedDict()

    def _window(self, sha: str) -> _Window:
        window = self._windows.get(sha)
        if window is None:
            window = self._windows[sha] = _Window()
            while len(self._windows) > RELEASES:
                self._windows.popitem(last=False)
        else:
            self._windows.move_to_end(sha)
        return window

    def observe(self, answers: Sequence[WatchedAnswer]) -> None:
        """A batch's answers, under the lock once."""
        with self._lock:
            for sha, route, index, score in answers:
                window = self._window(sha)
                window.answers.append((route, index, score))
                window.seen += 1

    def invoked(self, sha: str, invokes: Sequence[tuple[int, float]]) -> None:
        """A batch's invokes on release `sha`: (batch size, CPU seconds) each (runtime.Model.take_invokes)."""
        if not invokes:
            return
        with self._lock:
            window = self._window(sha)
            for size, cpu_s in invokes:
                if size > 0:
                    window.invokes.append((size, cpu_s / size))

    def window(self, sha: str) -> ReleaseWindow:
        """A copy of release `sha`'s window (empty when it has answered nothing yet)."""
        with self._lock:
            window = self._windows.get(sha)
            if window is None:
                return ReleaseWindow((), (), 0)
            return ReleaseWindow(tuple(window.answers), tuple(window.invokes), window.seen)

    def forget(self, sha: str) -> None:
        """Start release `sha`'s window afresh (a canary starts: only what it answers from now counts)."""
        with self._lock:
            self._windows.pop(sha, None)
