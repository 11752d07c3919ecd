"""Admission: the doorkeeper's window and false-positive rate, the cache storing only inputs
seen before, and the disk tier written only for models worth reading it for."""

from __future__ import annotations

import diskcache
import numpy as np
import pytest

from daemon.cache.cache_key import KEY_BYTES
from daemon.cache.doorkeeper import DEFAULT_BITS, DEFAULT_CAPACITY, HASHES, Doorkeeper
from daemon.cache.disk_tier import SafeDisk
from daemon.cache.result_cache import ResultCache
from daemon.config.schema import CacheConfig
from daemon.pipeline.request_path import handle
from tests.pipeline.test_request_path import PIPE, FakeModel, _request

WAIT_S = 30.0
PROBES = 200_000  # fresh keys asked of a full doorkeeper: ~480 false positives expected at 0.24 %


def _keys(n: int, seed: int) -> list[bytes]:
    """n distinct keys, as random as digests (the same every run: the measurement is exact)."""
    blob = np.random.default_rng(seed).bytes(n * KEY_BYTES)
    return [blob[i:i + KEY_BYTES] for i in range(0, len(blob), KEY_BYTES)]


def test_the_stated_false_positive_rate_is_what_a_full_generation_gives():
    door = Doorkeeper()
    for key in _keys(DEFAULT_CAPACITY - 1, seed=1):  # one short of the rotation: one full generation
        door.seen(key)
    stated = door.false_positive_rate
    assert stated == pytest.approx((1 - np.exp(-HASHES * DEFAULT_CAPACITY / DEFAULT_BITS)) ** HASHES)
    assert 0.002 < stated < 0.003
    measured = sum(key in door for key in _keys(PROBES, seed=2)) / PROBES  # `in` asks without remembering
    assert stated * 0.8 < measured < stated * 1.2, measured  # about ±4.4 standard deviations at 200k probes


def test_a_key_is_remembered_for_one_to_two_generations_then_forgotten():
    door = Doorkeeper(capacity=100, bits=1 << 16)
    old, *fillers = _keys(1 + 250, seed=3)
    assert door.seen(old) is False and door.seen(old) is True
    for key in fillers[:150]:  # the first generation fills and becomes the previous one
        door.seen(key)
    assert door.seen(old) is True  # found in the previous generation, carried into the current one
    for key in fillers[150:250]:  # two more rotations without it
        door.seen(key)
    for key in _keys(100, seed=4):
        door.seen(key)
    assert door.seen(old) is False


def test_the_doorkeeper_refuses_sizes_it_cannot_index():
    with pytest.raises(ValueError, match="power of two"):
        Doorkeeper(bits=1000)
    with pytest.raises(ValueError, match="at most"):
        Doorkeeper(bits=1 << 33)


def test_an_input_is_stored_on_its_second_sighting_and_hits_on_its_third(tmp_path):
    cache = ResultCache(CacheConfig(dir=tmp_path / "c"))
    model = FakeModel()
    replies = [handle(PIPE, _request([1, 3, 0, 0]), model, cache, 0.0, lambda: 0.0) for _ in range(3)]
    assert [r["cached"] for r in replies] == [False, False, True] and model.calls == [1, 1]
    for values in ([5, 5, 0, 0], [-1, -1, 0, 0]):  # seen once each: refused
        handle(PIPE, _request(values), model, cache, 0.0, lambda: 0.0)
    snap = cache.snapshot()
    assert (snap["admitted"], snap["refused"], snap["entries"]) == (1, 3, 1)
    assert (snap["hits"], snap["misses"]) == (1, 4)
    cache.close()


def _rows_on_disk(directory) -> int:
    raw = diskcache.Cache(str(directory), disk=SafeDisk)
    try:
        return len(raw)
    finally:
        raw.close()


@pytest.mark.parametrize("cost_per_sample_s, on_disk", [(0.0, 0), (1.0, 1)])
def test_a_cheap_models_results_never_reach_the_disk(tmp_path, cost_per_sample_s, on_disk):
    """The disk is read only for a model that costs more than a read (get_many), so only such
    a model's results are written: a cheap one's stay in memory, and a restart starts cold."""
    cache = ResultCache(CacheConfig(dir=tmp_path / "c"))
    model = FakeModel()
    model.cost_per_sample_s = cost_per_sample_s
    assert cost_per_sample_s == 0.0 or cost_per_sample_s > cache.snapshot()["disk_read_us"] / 1e6
    for _ in range(3):
        handle(PIPE, _request([1, 3, 0, 0]), model, cache, 0.0, lambda: 0.0)
    assert cache.snapshot()["entries"] == 1 and cache.flush(WAIT_S)
    assert cache.snapshot()["writes"] == on_disk
    cache.close()
    assert _rows_on_disk(tmp_path / "c") == on_disk
