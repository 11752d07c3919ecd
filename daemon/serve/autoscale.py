"""When the worker pool grows or shrinks: a pure policy, no threads, its clock injected.

The signal is the queue wait, the time from a request's arrival to a worker taking it
(and, while a request is still queued, its age so far: a backlog behind busy workers is
seen before any of it is taken). The pool feeds every wait to `observe` and asks
`decide` on a short tick; `decide` answers +1, 0 or -1.

- Grow by one as soon as a wait above `up_wait_s` has been seen since the last decision,
  unless a worker is idle with nothing queued (the backlog is already gone). After a
  growth the waits seen so far are forgotten, so one slow request grows the pool once.
- Shrink by one only after `down_after_s` of low load: every wait below half of
  `up_wait_s` and at least one worker idle at every decision, the whole window. The
  window starts again after any change, so the pool sheds one worker per cooldown.

The gap between the two thresholds (wait > up, then < up/2 for a whole cooldown) is
the hysteresis: a load whose wait oscillates around `up_wait_s` grows the pool (up to
`max`) and never shrinks it, so it does not flap.
"""

from __future__ import annotations

from typing import Callable

GROW, HOLD, SHRINK = 1, 0, -1
# Low load: waits below this fraction of the scale-up wait.
LOW_WAIT_FRACTION = 0.5


class Autoscaler:
    """Scaling decisions for a pool of `min_workers`..`max_workers`; not thread-safe (the pool holds its lock)."""

    def __init__(self, min_workers: int, max_workers: int, up_wait_s: float, down_after_s: float,
                 clock: Callable[[], float]):
        if not 1 <= min_workers <= max_workers:
            raise ValueError(f"need 1 <= min ({min_workers}) <= max ({max_workers})")
        self.min = min_workers
        self.max = max_workers
        self.up_wait_s = up_wait_s
        self.down_after_s = down_after_s
        self._low_wait = up_wait_s * LOW_WAIT_FRACTION
        self._clock = clock
        self._peak = 0.0  # the longest wait seen since the last decision
        self._calm_since = clock()  # low load from then on, without a break

    @property
    def fixed(self) -> bool:
        return self.min == self.max

    def observe(self, queue_wait_s: float) -> None:
        """A request's queue wait (or the age of one still queued)."""
        self._peak = max(self._peak, queue_wait_s)
        if queue_wait_s >= self._low_wait:
            self._calm_since = self._clock()

    def decide(self, busy: int, idle: int, depth: int) -> int:
        """+1 to add a worker, -1 to retire an idle one, 0 to hold; `depth` is the queue's length."""
        now, workers = self._clock(), busy + idle
        pressed, self._peak = self._peak > self.up_wait_s, 0.0
        if idle == 0:
            self._calm_since = now  # every worker busy: not low load, whatever the waits
        if workers < self.min:
            return self._changed(now, GROW)
        if pressed and workers < self.max and (idle == 0 or depth > 0):
            return self._changed(now, GROW)
        if workers > self.min and idle > 0 and now - self._calm_since >= self.down_after_s:
            return self._changed(now, SHRINK)
        return HOLD

    def _changed(self, now: float, step: int) -> int:
        self._calm_since = now  # the cooldown starts again after any change
        return step
