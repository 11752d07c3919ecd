"""The scaling policy on a fake clock: grow fast, shrink slowly and one at a time, within bounds, no flapping."""

from __future__ import annotations

import pytest

from daemon.serve.autoscale import GROW, HOLD, KEEP_RATIO, SHRINK, TRIAL_S, Autoscaler
from tests.fakes import FakeClock

UP_S = 0.050
DOWN_S = 30.0
TICK_S = UP_S / 2  # the pool decides on this tick


def _scaler(min_workers: int = 1, max_workers: int = 4) -> tuple[Autoscaler, FakeClock]:
    clock = FakeClock()
    return Autoscaler(min_workers, max_workers, UP_S, DOWN_S, clock), clock


class Pool:
    """Just the worker count, changed by each decision, as WorkerPool does."""

    def __init__(self, scaler: Autoscaler, clock: FakeClock, workers: int):
        self.scaler, self.clock, self.workers = scaler, clock, workers
        self.steps: list[tuple[float, int]] = []

    def tick(self, wait_s: float, busy: int, depth: int) -> int:
        self.clock.now += TICK_S
        self.scaler.observe(wait_s)
        step = self.scaler.decide(min(busy, self.workers), max(0, self.workers - busy), depth)
        if step:
            self.workers += step
            self.steps.append((round(self.clock.now, 3), step))
        return step


def test_grows_within_one_scale_up_wait_of_the_wait_exceeding_it():
    scaler, clock = _scaler()
    scaler.observe(UP_S * 0.9)
    assert scaler.decide(busy=1, idle=0, depth=3) == HOLD  # below the threshold: hold
    clock.now += UP_S
    scaler.observe(UP_S * 1.1)  # the oldest queued request passes the threshold
    assert scaler.decide(busy=1, idle=0, depth=3) == GROW  # at the next tick, well within UP_S


def test_a_wait_already_gone_does_not_grow():
    scaler, _ = _scaler()
    scaler.observe(UP_S * 2)
    assert scaler.decide(busy=0, idle=1, depth=0) == HOLD  # a worker idle and nothing queued
    assert scaler.decide(busy=1, idle=0, depth=1) == HOLD  # that wait was consumed by the last decision


def test_never_above_max_nor_below_min():
    scaler, clock = _scaler(min_workers=2, max_workers=3)
    pool = Pool(scaler, clock, workers=2)
    for _ in range(100):
        pool.tick(wait_s=1.0, busy=99, depth=50)  # overload: grows to max, then holds
    assert pool.workers == 3
    for _ in range(int(10 * DOWN_S / TICK_S)):
        pool.tick(wait_s=0.0, busy=0, depth=0)  # idle for ten cooldowns: shrinks to min, then holds
    assert pool.workers == 2
    assert [step for _, step in pool.steps] == [GROW, SHRINK]


def test_shrinks_only_after_the_cooldown_and_one_at_a_time():
    scaler, clock = _scaler(min_workers=1, max_workers=4)
    pool = Pool(scaler, clock, workers=4)
    for _ in range(int(3.5 * DOWN_S / TICK_S)):
        pool.tick(wait_s=0.001, busy=0, depth=0)
    shrinks = [at for at, step in pool.steps if step == SHRINK]
    assert len(shrinks) == 3 and pool.workers == 1
    assert shrinks[0] >= DOWN_S
    assert all(b - a >= DOWN_S for a, b in zip(shrinks, shrinks[1:]))  # one per cooldown, never two at once


def test_a_busy_moment_or_a_middling_wait_restarts_the_cooldown():
    scaler, clock = _scaler()
    pool = Pool(scaler, clock, workers=2)
    for i in range(int(3 * DOWN_S / TICK_S)):
        every_few_seconds = i % int(5.0 / TICK_S) == 0
        if i % 2:
            pool.tick(wait_s=UP_S * 0.6 if every_few_seconds else 0.0, busy=0, depth=0)
        else:
            pool.tick(wait_s=0.0, busy=2 if every_few_seconds else 0, depth=0)
    assert pool.steps == []  # never a whole cooldown of low load


def test_no_flapping_under_a_load_oscillating_around_the_threshold():
    scaler, clock = _scaler(min_workers=1, max_workers=4)
    pool = Pool(scaler, clock, workers=1)
    for i in range(int(5 * DOWN_S / TICK_S)):
        above = (i // 8) % 2 == 0  # 200 ms above the threshold, 200 ms below, for 150 s
        pool.tick(wait_s=UP_S * (1.2 if above else 0.8), busy=2 if above else 1, depth=2 if above else 0)
    assert all(step == GROW for _, step in pool.steps)  # it may grow, and never shrinks back
    assert pool.workers <= 4


def test_min_above_max_is_refused():
    with pytest.raises(ValueError, match="min"):
        Autoscaler(3, 2, UP_S, DOWN_S, FakeClock())


class ServingPool(Pool):
    """A pool serving a backlog (by default every worker busy) whose jobs served per second depend on its size."""

    def __init__(self, scaler: Autoscaler, clock: FakeClock, workers: int, rate_by_size: dict[int, float]):
        super().__init__(scaler, clock, workers)
        self.rate_by_size, self.done = rate_by_size, 0.0

    def tick(self, wait_s: float = 1.0, busy: int = 99, depth: int = 500) -> int:
        self.clock.now += TICK_S
        self.done += self.rate_by_size[self.workers] * TICK_S
        self.scaler.observe(wait_s)
        step = self.scaler.decide(min(busy, self.workers), max(0, self.workers - busy), depth, int(self.done))
        if step:
            self.workers += step
            self.steps.append((round(self.clock.now, 3), step))
        return step

    def run(self, seconds: float, **load) -> None:
        for _ in range(round(seconds / TICK_S)):
            self.tick(**load)


def test_a_grown_worker_that_slows_the_pool_is_retired_and_not_grown_again_for_a_cooldown():
    scaler, clock = _scaler(min_workers=1, max_workers=2)
    pool = ServingPool(scaler, clock, workers=1, rate_by_size={1: 4000.0, 2: 3300.0})  # activity's GIL
    pool.run(3 * TRIAL_S)
    assert [step for _, step in pool.steps] == [GROW, SHRINK] and pool.workers == 1
    assert scaler.trials_refused == 1 and "2 workers served 3300/s, 1 served 4000/s" in scaler.reason
    grown_at, retired_at = (at for at, _ in pool.steps)
    assert retired_at - grown_at >= TRIAL_S  # each size measured a whole trial
    pool.run(DOWN_S - 3 * TRIAL_S)  # the backlog goes on: no growth within the cooldown
    assert pool.workers == 1 and len(pool.steps) == 2
    pool.run(5 * TRIAL_S)  # after it, the same question again (the workload may have changed)
    assert [step for _, step in pool.steps] == [GROW, SHRINK, GROW, SHRINK] and scaler.trials_refused == 2


@pytest.mark.parametrize("grown_rate", [4000.0, 3700.0, 7000.0])
def test_a_grown_worker_that_does_not_slow_the_pool_beyond_the_margin_is_kept(grown_rate):
    scaler, clock = _scaler(min_workers=1, max_workers=2)
    pool = ServingPool(scaler, clock, workers=1, rate_by_size={1: 4000.0, 2: grown_rate})
    pool.run(DOWN_S)
    assert [step for _, step in pool.steps] == [GROW, SHRINK, GROW] and pool.workers == 2
    assert scaler.trials_refused == 0 and "back to 2" in scaler.reason  # and one trial only: no more steps


def test_the_verdict_needs_the_threshold_not_just_any_loss():
    assert 3599.0 < KEEP_RATIO * 4000.0 <= 3600.0  # 10 % of margin: 3,600/s against 4,000 is kept


def test_a_trial_that_finds_the_pool_idle_keeps_the_size_without_a_verdict():
    # A head-of-line wait: one camera frame ahead of sensor requests grows the pool, then the
    # backlog is gone before a trial could compare rates: the size stays, for latency.
    scaler, clock = _scaler(min_workers=1, max_workers=2)
    pool = ServingPool(scaler, clock, workers=1, rate_by_size={1: 4000.0, 2: 100.0})
    pool.tick()
    assert pool.workers == 2
    pool.run(TRIAL_S / 2)
    pool.tick(wait_s=0.0, busy=0, depth=0)  # the pool idle: no worker busy, nothing queued
    pool.run(3 * TRIAL_S)  # a new backlog at the same size: not a trial (no growth started it)
    assert pool.steps[1:] == [] and pool.workers == 2 and scaler.trials_refused == 0


def test_trials_walk_down_while_each_last_worker_slows_the_pool():
    scaler, clock = _scaler(min_workers=1, max_workers=3)
    pool = ServingPool(scaler, clock, workers=1, rate_by_size={1: 5000.0, 2: 4000.0, 3: 3000.0})
    pool.run(3 * TICK_S)
    assert pool.workers == 3  # grown on while the wait said so: the newest growth is on trial
    pool.run(4 * TRIAL_S)
    assert pool.workers == 1 and scaler.trials_refused == 2  # 3 slower than 2, then 2 slower than 1
    pool.run(DOWN_S / 2)
    assert pool.workers == 1


def test_trials_walk_down_only_as_far_as_a_worker_slows_the_pool():
    scaler, clock = _scaler(min_workers=1, max_workers=3)
    pool = ServingPool(scaler, clock, workers=1, rate_by_size={1: 3000.0, 2: 5000.0, 3: 4000.0})
    pool.run(DOWN_S / 2)
    assert pool.workers == 2 and scaler.trials_refused == 1  # 3 refused, 2 measured against 1 and kept
