"""The worker pool: batches up to max_batch, fair shares, the fill window, per-worker contexts, drain."""

from __future__ import annotations

import threading

from daemon.serve.autoscale import Autoscaler
from daemon.serve.workers import WorkerPool
from tests.fakes import FakeClock


def _held_pool(max_batch: int, **kw):
    """A one-worker pool whose first batch blocks until `gate` is set, recording every batch."""
    gate, started = threading.Event(), threading.Event()
    batches: list[list[int]] = []

    def process(ctx: int, jobs: list[int]) -> None:
        started.set()
        gate.wait(30)
        batches.append(jobs)

    pool: WorkerPool[int, int] = WorkerPool(1, lambda i: i, process, max_batch=max_batch, **kw)
    return pool, gate, started, batches


def test_a_worker_takes_everything_queued_up_to_max_batch_and_stop_drains():
    pool, gate, started, batches = _held_pool(max_batch=4)
    pool.start()
    assert pool.submit(0) and started.wait(30)  # job 0 runs alone; the rest queue behind it
    for job in range(1, 11):
        assert pool.submit(job)  # never refused for room: admission decides that
    gate.set()
    assert pool.stop(timeout_s=30)
    assert batches == [[0], [1, 2, 3, 4], [5, 6, 7, 8], [9, 10]]
    assert not pool.submit(11)  # stopped: refuses


def test_the_fill_window_waits_for_more_but_never_past_the_earliest_deadline():
    clock = FakeClock()
    deadlines = {1: 5.0}
    pool: WorkerPool[int, int] = WorkerPool(1, lambda i: i, lambda c, j: None, max_batch=8, max_delay_s=10.0,
                                            deadline_of=deadlines.get, arrival_of=lambda job: 0.0, clock=clock)
    pool.submit(1)
    clock.now = 5.0  # job 1's deadline has come: no more waiting, even though the window is open
    assert pool.take() == [1]
    pool.submit(2)
    pool.submit(3)
    clock.now = 20.0  # the window (10 s from the first job's arrival) has closed: take what is queued
    assert pool.take() == [2, 3]


def test_a_batch_is_cut_where_one_more_job_would_end_it_past_the_earliest_deadline():
    clock = FakeClock(100.0)
    deadlines = {2: 100.35, 5: 100.45}  # the other jobs have none
    pool: WorkerPool[int, int] = WorkerPool(1, lambda i: i, lambda c, j: None, max_batch=8,
                                            deadline_of=deadlines.get, clock=clock,
                                            batch_seconds=lambda first, n: 0.1 * n)
    for job in range(8):
        pool.submit(job)
    assert pool.take() == [0, 1, 2]  # a fourth would end the batch at 100.4, past job 2's 100.35
    clock.now = 100.1
    assert pool.take() == [3, 4, 5]  # ends at 100.4, before job 5's 100.45; a fourth: 100.5
    assert pool.take() == [6, 7]  # no deadline: up to max_batch


def test_a_first_job_that_cannot_make_its_deadline_is_still_taken_alone():
    clock = FakeClock(100.0)
    pool: WorkerPool[int, int] = WorkerPool(1, lambda i: i, lambda c, j: None, max_batch=8,
                                            deadline_of={0: 100.05}.get, clock=clock,
                                            batch_seconds=lambda first, n: 0.1 * n)
    for job in range(3):
        pool.submit(job)
    assert pool.take() == [0]  # the pipeline answers it expired; the others are not held behind it
    assert pool.take() == [1, 2]


def test_idle_workers_split_a_short_queue():
    pool: WorkerPool[int, int] = WorkerPool(2, lambda i: i, lambda c, j: None, max_batch=32)
    for job in range(6):
        pool.submit(job)
    pool._idle = 1  # one other worker is waiting too
    assert pool.take() == [0, 1, 2]


def test_each_worker_gets_its_own_context_and_a_failing_batch_does_not_kill_it():
    seen: set[int] = set()
    lock = threading.Lock()
    barrier = threading.Barrier(3)

    def process(ctx: int, jobs: list[int]) -> None:
        if jobs[0] < 0:
            raise RuntimeError("boom")
        barrier.wait(30)  # all three workers busy at once
        with lock:
            seen.add(ctx)

    pool: WorkerPool[int, int] = WorkerPool(3, lambda i: i, process, max_batch=1)
    pool.start()
    for job in (-1, 1, 2, 3):
        assert pool.submit(job)
    assert pool.stop(timeout_s=30)
    assert seen == {0, 1, 2}


def test_a_burst_handed_on_at_once_wakes_as_many_idle_workers_as_it_has_jobs():
    ran: list[int] = []
    lock = threading.Lock()
    together = threading.Barrier(3)

    def process(ctx: int, jobs: list[int]) -> None:
        together.wait(30)  # passes only if the one hand-off woke all three workers
        with lock:
            ran.extend(jobs)

    pool: WorkerPool[int, int] = WorkerPool(3, lambda i: i, process, max_batch=8)
    pool.start()
    with pool._cond:  # every worker waiting for work before the burst arrives
        assert pool._cond.wait_for(lambda: pool._idle == 3, 30)
    assert pool.submit_many([1, 2, 3])
    assert pool.stop(timeout_s=30)
    assert sorted(ran) == [1, 2, 3] and not together.broken
    assert not pool.submit_many([4])  # stopped: refuses


def test_stop_reports_work_left_after_the_time_limit():
    gate = threading.Event()
    pool: WorkerPool[int, None] = WorkerPool(1, lambda i: None, lambda c, j: gate.wait(30))
    pool.start()
    pool.submit(1)
    assert pool.stop(timeout_s=0.05) is False
    gate.set()


def test_the_fill_window_collects_arrivals_until_the_batch_is_full():
    pool: WorkerPool[int, int] = WorkerPool(1, lambda i: i, lambda c, j: None, max_batch=3, max_delay_s=60.0)
    taken: list[list[int]] = []
    taker = threading.Thread(target=lambda: taken.append(pool.take()))
    taker.start()
    for job in (1, 2, 3, 4):
        pool.submit(job)
    taker.join(30)
    assert taken == [[1, 2, 3]]  # full before the 60 s window closed; job 4 waits for the next batch
    assert pool.depth == 1


def test_a_wedged_worker_shows_as_no_progress_so_the_watchdog_stops():
    clock = FakeClock()
    pool, gate, started, batches = _held_pool(max_batch=1, clock=clock)
    assert pool.progressing(within_s=10.0)  # idle is fine
    pool.start()
    pool.submit(1)
    assert started.wait(30)
    clock.now = 9.0
    assert pool.progressing(within_s=10.0)
    clock.now = 11.0  # stuck in its batch (an invoke that never returns) past the limit
    assert not pool.progressing(within_s=10.0)
    gate.set()
    assert pool.stop(timeout_s=30) and pool.progressing(within_s=10.0)


class _Watched:
    """A pool's worker count and the jobs it processed, waited on by condition (no timing guesses)."""

    def __init__(self):
        self.cond = threading.Condition()
        self.sizes: list[int] = []
        self.done: list[int] = []
        self.contexts: list[int] = []

    def resized(self, workers: int) -> None:
        with self.cond:
            self.sizes.append(workers)
            self.cond.notify_all()

    def processed(self, jobs: list[int]) -> None:
        with self.cond:
            self.done.extend(jobs)
            self.cond.notify_all()

    def wait(self, predicate) -> None:
        with self.cond:
            assert self.cond.wait_for(predicate, timeout=30), (self.sizes, len(self.done))


def test_an_adaptive_pool_grows_under_a_backlog_and_shrinks_one_per_cooldown_losing_no_job():
    clock, gate, watched = FakeClock(), threading.Event(), _Watched()
    up_s, down_s = 0.010, 10.0
    scaler = Autoscaler(1, 3, up_s, down_s, clock)

    def make_context(index: int) -> int:
        watched.contexts.append(index)
        return index

    def process(ctx: int, jobs: list[int]) -> None:
        gate.wait(30)
        watched.processed(jobs)

    arrivals: dict[int, float] = {}
    pool: WorkerPool[int, int] = WorkerPool(3, make_context, process, max_batch=2, arrival_of=lambda j: arrivals[j],
                                            clock=clock, scaler=scaler, on_resize=watched.resized)
    pool.start()
    assert pool.size == 1 and watched.sizes == [1]
    for job in range(20):
        arrivals[job] = clock.now
        pool.submit(job)
    clock.now = 1.0  # the oldest queued job has waited 1 s, far past scale_up_wait: grow, to max and no further
    watched.wait(lambda: watched.sizes[-1] == 3)
    gate.set()
    watched.wait(lambda: len(watched.done) == 20)
    assert sorted(watched.contexts) == [0, 1, 2] and pool.scale_ups == 2
    for expected in (2, 1):
        clock.now += down_s  # a whole cooldown of low load: one worker retires, then the window starts again
        watched.wait(lambda: watched.sizes[-1] == expected)
        assert pool.size == expected
    clock.now += 10 * down_s
    for job in range(20, 30):  # the one left serves on; min is never undercut
        arrivals[job] = clock.now
        pool.submit(job)
    watched.wait(lambda: len(watched.done) == 30)
    assert pool.stop(timeout_s=30)
    assert sorted(watched.done) == list(range(30)) and pool.size == 1 and pool.scale_downs == 2
    assert watched.sizes == [1, 2, 3, 2, 1]


def test_min_equal_to_max_is_the_fixed_pool():
    pool: WorkerPool[int, int] = WorkerPool(2, lambda i: i, lambda c, j: None,
                                            scaler=Autoscaler(2, 2, 0.01, 0.01, FakeClock()))
    pool.start()
    assert pool.size == 2 and not any(t.name.endswith("-scaler") for t in threading.enumerate())
    assert pool.stop(timeout_s=30)
