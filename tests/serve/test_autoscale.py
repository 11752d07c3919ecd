"""The scaling policy on a fake clock: grow fast, shrink slowly and one at a time, within bounds, no flapping."""

from __future__ import annotations

import pytest

from daemon.serve.autoscale import GROW, HOLD, SHRINK, Autoscaler
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
