"""Service wiring that needs no broker: start-up order, signal rules, admission bound."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.config.schema import WorkersConfig
from daemon.config.loader import load_config
from daemon.errors import ModelError
from daemon.lifecycle.link import receive_maximum
from daemon.lifecycle.gc_settle import settle_gc
from daemon.lifecycle.service import Service
from daemon.lifecycle.signals import ForcedExit
from daemon.lifecycle.steps import Step

ROOT = Path(__file__).resolve().parents[2]


def test_start_up_connects_before_the_workers_start_so_shutdown_drains_them_before_disconnecting():
    service = Service(load_config(ROOT / "config.yaml"))
    names = [s.name for s in service.steps()]
    assert names == ["models", "cache", "serving", "mqtt", "workers", "metrics", "intake", "fleet", "http"]
    stopping = [s.name for s in reversed(service.steps()) if s.stop is not None]
    # replies still have a connection to leave by; the HTTP listener goes first (workers still answer
    # its requests in flight), then the fleet agent, which swaps models
    assert stopping == ["http", "fleet", "intake", "workers", "mqtt", "cache"]


def test_signals_are_only_queued_and_a_second_sigint_forces_the_exit():
    import signal

    service = Service(load_config(ROOT / "config.yaml"))
    service.signals.handle(signal.SIGHUP)
    service.signals.handle(signal.SIGINT)
    assert service.signals.stop_requested and not service._stopping  # nothing happens inside a handler
    service._handle_signals()  # the main loop's turn
    assert service._stopping
    with pytest.raises(ForcedExit):
        service.signals.handle(signal.SIGINT)


def test_a_failed_step_leaves_only_the_earlier_steps_to_stop_in_reverse():
    service = Service(load_config(ROOT / "config.yaml"))
    log: list[str] = []

    def fail() -> None:
        raise ModelError("m.tflite", "gone")

    service.steps = lambda: [Step("a", lambda: log.append("start a"), lambda: log.append("stop a")),
                             Step("b", lambda: log.append("start b"), lambda: log.append("stop b")),
                             Step("c", fail, lambda: log.append("stop c"))]
    with pytest.raises(ModelError, match="gone"):
        service.startup()
    service.shutdown()
    assert log == ["start a", "start b", "stop b", "stop a"]


def test_a_second_sigint_during_the_drain_is_not_swallowed_by_shutdown():
    import signal

    service = Service(load_config(ROOT / "config.yaml"))
    log: list[str] = []
    service.signals.handle(signal.SIGINT)  # the first one started the drain
    service.steps = lambda: [Step("a", lambda: None, lambda: log.append("stop a")),
                             Step("drain", lambda: None, lambda: service.signals.handle(signal.SIGINT))]
    service.startup()
    with pytest.raises(ForcedExit):
        service.shutdown()
    assert log == []  # nothing more is waited for


def test_receive_maximum_is_bounded_and_never_above_what_the_byte_budget_holds():
    assert receive_maximum(WorkersConfig(max=2, queue_mb=64)) == 1024
    assert receive_maximum(WorkersConfig(max=1, queue_mb=0.5)) == 512


def test_the_stats_snapshot_reports_the_cache_hit_rate_and_the_queue(tmp_path):
    from dataclasses import replace

    config = load_config(ROOT / "config.yaml")
    service = Service(replace(config, cache=replace(config.cache, dir=tmp_path / "cache")))
    steps = {s.name: s for s in service.steps()}
    for step in (steps["models"], steps["cache"], steps["serving"], steps["workers"]):  # no broker needed
        step.start()
        service._started.append(step)
    try:
        snapshot = service.snapshot()
    finally:
        service.shutdown()
    assert snapshot["cache"]["hit_rate"] == 0.0 and snapshot["cache"]["entries"] == 0
    assert snapshot["queue"] == {"depth": 0, "busy": 0, "bytes": 0, "peak_bytes": 0, "predicted_wait_ms": 0.0,
                                 "holds": 0, "holding": False}
    for key in ("received", "results", "errors", "workers", "models", "latency_ms", "reconnects", "outbox",
                "uptime_s", "batch_size"):
        assert key in snapshot, key
    assert snapshot["models"]["activity"] == {"loaded": True, "sha256": service._models["activity"].sha256[:12],
                                              "cold_starts": 0, "cold_start_ms": None}


class _Part:
    """A serving part with a reference cycle (as bound methods and closures make)."""

    def __init__(self):
        self.me = self


def test_settle_gc_freezes_what_start_up_made_and_a_reload_lets_the_replaced_parts_go():
    import gc
    import weakref

    try:
        part = _Part()
        gone = weakref.ref(part)
        settle_gc()  # start-up: the part is frozen, out of every collection's walk
        assert gc.get_freeze_count() > 0
        del part  # replaced by a reload: unreachable, but frozen
        gc.collect()
        assert gone() is not None
        settle_gc()  # after the reload: unfrozen first, so the old part is collected
        assert gone() is None
    finally:
        gc.unfreeze()
