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

A grown worker must pay its way (when the pool feeds `done`, its count of jobs served).
Threads share one GIL: on a workload whose Python work dominates (decoding large JSON
requests), one more worker only takes the GIL from the others and from the MQTT thread,
and the pool serves fewer requests per second with it than without. So the newest growth
is on trial while the pool keeps serving (a worker busy or jobs queued at every decision):
TRIAL_S at the new size (growing on if the wait says so, which puts the newer size on
trial instead), then one worker retired and TRIAL_S at the old size. The grown size is
kept (grown back) unless it served under KEEP_RATIO of the smaller pool's rate; then the
pool does not grow past the smaller size for `down_after_s` (`trials_refused`), and the
same question is asked of that size's last worker, one size lower, down to `min`. A
decision that finds the pool idle (no worker busy, nothing queued) ends the trial without
a verdict, keeping the size: a head-of-line wait behind one long job (a camera frame ahead
of sensor requests) grows the pool for latency, and once that backlog is gone it is not
judged on a rate that only says how fast requests arrived.
"""

from __future__ import annotations

from typing import Callable, Optional

GROW, HOLD, SHRINK = 1, 0, -1
# Low load: waits below this fraction of the scale-up wait.
LOW_WAIT_FRACTION = 0.5
# A trial measures each size for this long, serving all along (thousands of jobs on a
# busy pool: the rates compared are not one batch's noise).
TRIAL_S = 1.0
# The grown size is kept unless its rate is under this fraction of the smaller size's:
# 10 % of margin for a shared machine's noise (a second worker that measures equal stays).
KEEP_RATIO = 0.9
_UP, _DOWN = "up", "down"


class _Trial:
    """One growth on trial: which size is being measured (`phase`), since when, from which count."""

    __slots__ = ("phase", "size", "since", "done", "rate_up")

    def __init__(self, phase: str, size: int, since: Optional[float], done: int, rate_up: float = 0.0):
        self.phase, self.size, self.since, self.done, self.rate_up = phase, size, since, done, rate_up


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
        self._trial: Optional[_Trial] = None
        self._refused_size = 0  # a trial found this size slower than one fewer: no growth to it ...
        self._refused_until = 0.0  # ... until then
        self.trials_refused = 0
        self.reason = ""  # why the last change was made, for the pool's log line

    @property
    def fixed(self) -> bool:
        return self.min == self.max

    def observe(self, queue_wait_s: float) -> None:
        """A request's queue wait (or the age of one still queued)."""
        self._peak = max(self._peak, queue_wait_s)
        if queue_wait_s >= self._low_wait:
            self._calm_since = self._clock()

    def decide(self, busy: int, idle: int, depth: int, done: Optional[int] = None) -> int:
        """+1 to add a worker, -1 to retire an idle one, 0 to hold; `depth` is the queue's length,
        `done` the jobs served so far (None: no trials)."""
        now, workers = self._clock(), busy + idle
        pressed, self._peak = self._peak > self.up_wait_s, 0.0
        if idle == 0:
            self._calm_since = now  # every worker busy: not low load, whatever the waits
        if workers < self.min:
            return self._changed(now, GROW, "below min")
        if self._trial is not None and done is not None:
            step = self._judge(now, workers, busy > 0 or depth > 0, done)
            if step is not None and (step != HOLD or self._trial is None or self._trial.phase == _DOWN):
                return step  # measuring a smaller size holds it; measuring a grown one, it may grow on
        if pressed and workers < self.max and (idle == 0 or depth > 0) and not self._refused(now, workers + 1):
            if done is not None:  # the newest growth is on trial, measured from its first decision at the size
                self._trial = _Trial(_UP, workers + 1, None, done)
            return self._changed(now, GROW, f"queue wait above {self.up_wait_s * 1000:.0f} ms")
        if workers > self.min and idle > 0 and now - self._calm_since >= self.down_after_s:
            return self._changed(now, SHRINK, f"low load for {self.down_after_s:.0f}s")
        return HOLD

    def _refused(self, now: float, size: int) -> bool:
        return size >= self._refused_size > 0 and now < self._refused_until

    def _judge(self, now: float, workers: int, serving: bool, done: int) -> Optional[int]:
        """The trial's step: HOLD while measuring, SHRINK to measure one worker fewer, GROW back or
        HOLD at a verdict; None once it has ended without one (the normal rules apply)."""
        trial = self._trial
        if not serving or workers != trial.size:  # the load changed: no verdict, keep this size
            self._trial = None
            return None
        if trial.since is None:
            trial.since, trial.done = now, done
        if now - trial.since < TRIAL_S:
            return HOLD
        rate = (done - trial.done) / (now - trial.since)
        if trial.phase == _UP:
            return self._measure_fewer(now, workers, rate, f"trial: {workers} workers served {rate:.0f}/s")
        self._trial = None
        verdict = f"trial: {workers + 1} workers served {trial.rate_up:.0f}/s, {workers} served {rate:.0f}/s"
        if trial.rate_up >= KEEP_RATIO * rate:
            return self._changed(now, GROW, f"{verdict}: back to {workers + 1}")
        self._refused_size, self._refused_until = workers + 1, now + self.down_after_s
        self.trials_refused += 1
        if workers > self.min:  # and is this size worth its last worker? the same question, one lower
            return self._measure_fewer(now, workers, rate, f"{verdict}: no more than {workers} for "
                                                           f"{self.down_after_s:.0f}s")
        self.reason = f"{verdict}: staying at {workers} for {self.down_after_s:.0f}s"
        return HOLD

    def _measure_fewer(self, now: float, workers: int, rate: float, why: str) -> int:
        """Retire one worker to measure the pool without it, against `rate`, this size's."""
        self._trial = _Trial(_DOWN, workers - 1, None, 0, rate_up=rate)
        return self._changed(now, SHRINK, f"{why}; measuring {workers - 1}")

    def _changed(self, now: float, step: int, reason: str) -> int:
        self._calm_since = now  # the cooldown starts again after any change
        self.reason = reason
        return step
