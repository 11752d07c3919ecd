"""Scale to zero (daemon/model/residency.py): the idle decision on a fake clock, unloading and lazy reloading."""

from __future__ import annotations

import gc
import threading
from pathlib import Path

import numpy as np
import pytest

from daemon.model.residency import IdleClock, Residency
from daemon.model.runtime import Model
from tests.fakes import FakeClock

ROOT = Path(__file__).resolve().parents[2]
ACTIVITY = ROOT / "models/activity/model.tflite"


def test_a_model_is_idle_once_unused_for_idle_s_and_never_when_idle_s_is_zero():
    clock, idle_s = FakeClock(100.0), [5.0]
    idle = IdleClock(lambda: idle_s[0], clock)
    assert not idle.idle("a")  # never used: nothing to unload
    idle.used("a")
    clock.now += 4.9
    assert not idle.idle("a")
    clock.now += 0.1
    assert idle.idle("a")
    idle.used("a")  # a use restarts the count
    assert not idle.idle("a")
    idle_s[0] = 0.0
    clock.now += 1000.0
    assert not idle.idle("a")


def test_due_in_is_the_time_until_the_first_loaded_model_goes_idle():
    clock = FakeClock(100.0)
    idle = IdleClock(lambda: 10.0, clock)
    assert idle.due_in({"a"}) is None  # never used
    idle.used("a")
    clock.now += 3.0
    idle.used("b")
    clock.now += 1.0
    assert idle.due_in({"a", "b"}) == 6.0
    assert idle.due_in({"b"}) == 9.0
    clock.now += 20.0
    assert idle.due_in({"a"}) == 0.0
    assert IdleClock(lambda: 0.0, clock).due_in({"a"}) is None


def _residency(clock: FakeClock, idle_s: float = 5.0) -> tuple[Residency, list]:
    trims: list = []
    return Residency(lambda: idle_s, clock, give_back=lambda: trims.append(1)), trims


def _copy(residency: Residency, loads: list):
    def load() -> Model:
        loads.append(1)
        model = Model(ACTIVITY, max_batch=4)
        model.warm_up()
        return model
    return residency.copy("activity", load(), load)


def test_an_idle_copy_is_freed_and_the_next_invoke_loads_it_with_the_same_scores():
    clock, loads = FakeClock(100.0), []
    residency, trims = _residency(clock)
    lazy = _copy(residency, loads)
    q = lazy.quantize(np.random.default_rng(1).normal(size=(3, 50, 6)).astype(np.float32))
    before = lazy.infer_quantized(q)
    clock.now += 4.0
    assert residency.unload_idle() == [] and lazy.loaded
    clock.now += 1.0
    assert residency.unload_idle() == ["activity"] and not lazy.loaded and trims == [1]
    assert residency.state()["activity"] == {"loaded": False, "cold_starts": 0, "cold_start_ms": None}
    x = np.random.default_rng(1).normal(size=(3, 50, 6)).astype(np.float32)
    assert np.array_equal(lazy.quantize(x), q) and len(loads) == 1  # quantizing needs no load
    after = lazy.infer_quantized(q)
    assert np.array_equal(before, after) and len(loads) == 2
    state = residency.state()["activity"]
    assert state["loaded"] and state["cold_starts"] == 1 and state["cold_start_ms"] > 0


def test_a_copy_in_use_is_not_freed_and_zero_never_unloads():
    clock, loads = FakeClock(100.0), []
    residency, _ = _residency(clock)
    lazy = _copy(residency, loads)
    clock.now += 10.0
    with lazy._lock:  # a worker is invoking it
        assert residency.unload_idle() == []
    assert lazy.loaded
    never, _ = _residency(clock, idle_s=0.0)
    kept = _copy(never, loads)
    clock.now += 1e6
    assert never.unload_idle() == [] and kept.loaded and never.due_in() is None


def test_every_workers_copy_is_freed_and_a_dropped_copy_leaves_the_stats():
    clock, loads = FakeClock(100.0), []
    residency, trims = _residency(clock)
    copies = [_copy(residency, loads) for _ in range(2)]
    clock.now += 5.0
    assert residency.unload_idle() == ["activity"] and trims == [1]
    assert not any(c.loaded for c in copies)
    worker = threading.Thread(target=copies[0].infer_quantized, args=(np.zeros((1, 50, 6), np.int8),))
    worker.start()  # loaded again on the thread that needs it
    worker.join()
    assert residency.state()["activity"]["loaded"] and not copies[1].loaded
    del copies
    gc.collect()
    assert residency.state() == {}  # a retired worker's copies go with it


def test_the_prometheus_exporter_shows_loaded_and_cold_starts_by_model():
    pytest.importorskip("prometheus_client")
    from daemon.obs.prometheus import StatsCollector
    from daemon.obs.stats import Stats

    state = {"activity": {"loaded": False, "cold_starts": 2, "cold_start_ms": 1.5}}
    families = {f.name: f for f in StatsCollector(Stats(), dict, lambda: state).collect()}
    loaded = families["edge_inferd_model_loaded"].samples[0]
    assert loaded.labels == {"model": "activity"} and loaded.value == 0
    assert families["edge_inferd_model_cold_starts"].samples[0].value == 2
