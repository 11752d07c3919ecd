"""The worker pool: bounded queue, explicit refusal, per-worker contexts, drain on stop."""

from __future__ import annotations

import threading

from daemon.workers import WorkerPool


def test_full_queue_refuses_and_stop_drains_everything_queued():
    gate = threading.Event()
    started = threading.Event()
    done: list[tuple[int, int]] = []

    def process(ctx: int, job: int) -> None:
        started.set()
        gate.wait(30)
        done.append((ctx, job))

    pool: WorkerPool[int, int] = WorkerPool(1, 2, make_context=lambda i: 100 + i, process=process)
    pool.start()
    assert pool.submit(1)
    assert started.wait(30)  # job 1 is running, the queue is empty
    assert pool.submit(2) and pool.submit(3)
    assert not pool.submit(4)  # queue of 2 is full: refused, never blocks
    gate.set()
    assert pool.stop(timeout_s=30)
    assert done == [(100, 1), (100, 2), (100, 3)]
    assert not pool.submit(5)  # stopped: refuses


def test_each_worker_gets_its_own_context_and_a_failing_job_does_not_kill_it():
    seen: set[int] = set()
    lock = threading.Lock()
    barrier = threading.Barrier(3)

    def process(ctx: int, job: int) -> None:
        if job < 0:
            raise RuntimeError("boom")
        barrier.wait(30)  # all three workers busy at once
        with lock:
            seen.add(ctx)

    pool: WorkerPool[int, int] = WorkerPool(3, 10, make_context=lambda i: i, process=process)
    pool.start()
    for job in (-1, 1, 2, 3):
        assert pool.submit(job)
    assert pool.stop(timeout_s=30)
    assert seen == {0, 1, 2}


def test_stop_reports_work_left_after_the_time_limit():
    gate = threading.Event()
    pool: WorkerPool[int, None] = WorkerPool(1, 4, make_context=lambda i: None, process=lambda c, j: gate.wait(30))
    pool.start()
    pool.submit(1)
    assert pool.stop(timeout_s=0.05) is False
    gate.set()
