"""The signal queue: handlers queue, the main loop wakes; no lock is taken in a handler."""

from __future__ import annotations

import os
import signal
import threading

from daemon.lifecycle.signals import SignalQueue


def test_a_queued_signal_wakes_a_waiting_loop_in_order():
    queue = SignalQueue()
    assert queue.wait(0.0) is False and queue.pop() is None
    queue.handle(signal.SIGHUP)
    queue.handle(signal.SIGTERM)
    assert queue.wait(10.0) is True and queue.stop_requested
    assert [queue.pop(), queue.pop(), queue.pop()] == [signal.SIGHUP, signal.SIGTERM, None]
    assert queue.wait(0.0) is False  # the wake-up bytes were drained with the wait


def test_a_real_signal_delivered_during_wait_returns_it_at_once():
    """The handler runs in the main thread, inside wait(): it must wake it through the pipe. (The old
    Event-based queue could deadlock here when set() hit the lock wait() held: a race this cannot force.)"""
    queue = SignalQueue()
    old = signal.signal(signal.SIGUSR1, queue.handle)
    try:
        timer = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGUSR1))
        timer.start()
        assert queue.wait(30.0) is True  # woken by the handler, long before the timeout
        assert queue.pop() == signal.SIGUSR1
        timer.join()
    finally:
        signal.signal(signal.SIGUSR1, old)


def test_many_signals_never_block_the_handler_even_with_the_pipe_full():
    queue = SignalQueue()
    for _ in range(100_000):  # far more wake-up bytes than a pipe holds
        queue.handle(signal.SIGHUP)
    assert queue.wait(0.0) and sum(1 for _ in iter(queue.pop, None)) == 100_000
