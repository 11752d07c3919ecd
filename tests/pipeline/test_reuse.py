"""The per-device fast path (daemon/pipeline/reuse.py) through the pure pipeline, with a fake interpreter and clock."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from daemon.config.loader import load_config
from daemon.errors import ConfigError
from daemon.config.reuse import ReuseConfig
from daemon.pipeline.route_pipeline import Request, RoutePipeline
from daemon.pipeline.request_path import handle_batch, store
from daemon.pipeline.reuse import DeviceReuse
from tests.pipeline.test_request_path import PIPE, ROUTE, DictCache, FakeModel, _request

ROOT = Path(__file__).resolve().parents[2]
EPS = 0.5
AGE_S = 10.0


def _reuse(devices: int = 100) -> DeviceReuse:
    return DeviceReuse(ReuseConfig(max_change=EPS, max_age_s=AGE_S, devices=devices))


def _one(values, device: str, model, reuse, at: float, cache=None, pipe: RoutePipeline = PIPE) -> dict:
    return handle_batch(pipe, [Request(_request(values), at, None, device)], model, cache, lambda: at,
                        reuse).replies[0]


def test_within_max_change_reuses_without_inference():
    model, reuse = FakeModel(), _reuse()
    first = _one([1, 1, 0, 0], "s/a", model, reuse, 0.0)
    # Downsample by 2: model input [1.0, 0.0] -> [1.4, 0.3]: a change of 0.4 <= 0.5.
    second = _one([1.4, 1.4, 0.3, 0.3], "s/a", model, reuse, 1.0)
    assert (first["reused"], second["reused"]) == (False, True) and model.calls == [1]
    assert second["top_k"] == first["top_k"] and second["cached"] is False
    assert reuse.snapshot() == {"devices": 1, "hits": 1, "misses": 1, "skipped": 0}


def test_beyond_max_change_infers_and_drift_is_measured_from_the_inferred_input():
    model, reuse = FakeModel(), _reuse()
    _one([0, 0, 0, 0], "s/a", model, reuse, 0.0)
    assert _one([0.6, 0.6, 0, 0], "s/a", model, reuse, 1.0)["reused"] is False  # 0.6 > 0.5
    assert _one([0.9, 0.9, 0, 0], "s/a", model, reuse, 2.0)["reused"] is True  # 0.3 from the last inferred
    # Reused inputs never become the reference: 1.2 is 0.6 from the inferred 0.6, though 0.3 from 0.9.
    assert _one([1.2, 1.2, 0, 0], "s/a", model, reuse, 3.0)["reused"] is False
    assert model.calls == [1, 1, 1]


def test_not_after_max_age():
    model, reuse = FakeModel(), _reuse()
    _one([1, 1, 0, 0], "s/a", model, reuse, 100.0)
    assert _one([1, 1, 0, 0], "s/a", model, reuse, 100.0 + AGE_S - 0.001)["reused"] is True
    assert _one([1, 1, 0, 0], "s/a", model, reuse, 100.0 + AGE_S)["reused"] is False
    assert model.calls == [1, 1]


def test_devices_are_apart_and_a_new_model_digest_never_gets_old_results():
    model, reuse = FakeModel(), _reuse()
    _one([1, 1, 0, 0], "s/a", model, reuse, 0.0)
    assert _one([1, 1, 0, 0], "s/b", model, reuse, 0.0)["reused"] is False
    reloaded = RoutePipeline.build(ROUTE, "cd" * 32, PIPE.labels)
    assert _one([1, 1, 0, 0], "s/a", model, reuse, 0.0, pipe=reloaded)["reused"] is False
    assert model.calls == [1, 1, 1]


def test_lru_keeps_at_most_devices_and_forgets_the_least_recent():
    model, reuse = FakeModel(), _reuse(devices=2)
    for device in ("s/a", "s/b", "s/a", "s/c"):  # s/b is least recently seen when s/c arrives
        _one([1, 1, 0, 0], device, model, reuse, 0.0)
    assert reuse.snapshot()["devices"] == 2
    assert _one([1, 1, 0, 0], "s/a", model, reuse, 0.0)["reused"] is True
    assert _one([1, 1, 0, 0], "s/b", model, reuse, 0.0)["reused"] is False


def test_reused_is_absent_without_reuse_and_a_batch_mixes_hits_misses_and_cache():
    model, reuse, cache = FakeModel(), _reuse(), DictCache()
    model.cost_per_sample_s = 1.0  # a costly model: its batches consult reuse
    assert "reused" not in _one([1, 1, 0, 0], "s/a", model, None, 0.0)
    first = handle_batch(PIPE, [Request(_request([1, 1, 0, 0]), 0.0, None, "s/a")], model, cache, lambda: 0.0, reuse)
    store(cache, first)
    for o in handle_batch(PIPE, [Request(_request([1, 1, 0, 0]), 0.0, None, "s/b")], model, cache,
                          lambda: 0.0, reuse).replies:
        assert (o["cached"], o["reused"]) == (True, False)  # an exact cache hit is a reference too
    batch = [Request(_request([1.1, 1.1, 0, 0]), 1.0, None, "s/a"), Request(_request([-1, -1, 0, 0]), 1.0, None, "s/c"),
             Request(_request([-1, -1, 0, 0]), 1.0, None, "s/b")]
    replies = handle_batch(PIPE, batch, model, cache, lambda: 1.0, reuse).replies
    assert [r["reused"] for r in replies] == [True, False, False]
    assert [r["label"] for r in replies] == ["high", "low", "low"] and model.calls == [1, 1, 2]


def test_a_cheap_models_batch_skips_reuse_and_forgets_its_devices_while_a_lone_request_reuses():
    """Below BATCH_MIN_COST_S a sample, a batched hit would save less than its bookkeeping."""
    from daemon.pipeline.reuse import BATCH_MIN_COST_S

    model, reuse = FakeModel(), _reuse()
    model.cost_per_sample_s = BATCH_MIN_COST_S / 2
    _one([1, 1, 0, 0], "s/a", model, reuse, 0.0)
    _one([1, 1, 0, 0], "s/b", model, reuse, 0.0)
    assert _one([1, 1, 0, 0], "s/a", model, reuse, 0.5)["reused"] is True  # alone: reused
    batch = [Request(_request([1, 1, 0, 0]), 1.0, None, d) for d in ("s/a", "s/b")]
    calls = len(model.calls)
    replies = handle_batch(PIPE, batch, model, None, lambda: 1.0, reuse).replies
    assert [r["reused"] for r in replies] == [False, False] and len(model.calls) == calls + 1
    assert reuse.snapshot() == {"devices": 0, "hits": 1, "misses": 2, "skipped": 2}
    assert _one([1, 1, 0, 0], "s/a", model, reuse, 1.5)["reused"] is False  # forgotten: inferred again
    assert _one([1, 1, 0, 0], "s/a", model, reuse, 2.0)["reused"] is True


def test_an_older_request_never_replaces_a_newer_reference():
    reuse, x = _reuse(), np.zeros((1, 2), np.float32)
    scores = np.ones((1, 3), np.float32)
    reuse.remember(["d"], x + 2.0, scores, "m", [5.0], now=5.0)
    reuse.remember(["d"], x, scores * 0, "m", [4.0], now=6.0)  # a slower worker, an older request
    assert reuse.match(["d"], x + 2.0, "m", 6.0)[0] is not None
    assert reuse.match(["d"], x, "m", 6.0)[0] is None


def test_concurrent_workers_on_the_same_devices_stay_consistent():
    reuse, barrier = _reuse(devices=8), threading.Barrier(4)
    scores = np.ones((1, 3), np.float32)

    def work(k: int) -> None:
        barrier.wait()
        for i in range(500):
            device, x = [f"d{i % 16}"], np.full((1, 2), k, np.float32)
            if reuse.match(device, x, "m", float(i))[0] is None:
                reuse.remember(device, x, scores, "m", [float(i)], float(i))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    snap = reuse.snapshot()
    assert snap["devices"] == 8 and snap["hits"] + snap["misses"] == 4 * 500


def _config(tmp_path: Path, reuse: str):
    text = (ROOT / "config.yaml").read_text().replace(" models/", f" {ROOT}/models/")
    anchor = "    publish: results/{1}/activity   #"
    assert anchor in text
    path = tmp_path / "config.yaml"
    path.write_text(text.replace(anchor, f"    reuse: {reuse}\n{anchor}", 1))
    return load_config(path)


def test_config_reads_reuse_and_reports_bad_values(tmp_path):
    cfg = _config(tmp_path, "{max_change: 0.05, max_age_s: 30}")
    assert cfg.routes[0].reuse == ReuseConfig(max_change=0.05, max_age_s=30.0, devices=10_000)
    assert cfg.routes[1].reuse is None
    with pytest.raises(ConfigError) as err:
        _config(tmp_path, "{max_change: -1, devices: 0, every: 2}")
    text = "\n".join(err.value.errors)
    for key in ("reuse.max_change", "reuse.max_age_s", "reuse.devices", "reuse.every"):
        assert f"routes[0].{key}" in text, text


def test_batch_and_single_row_comparisons_agree_with_max_abs_difference():
    """The vectorized batch compare, the single-row path and its first-element early out."""
    rng = np.random.default_rng(7)
    reuse, scores = _reuse(), np.arange(12, dtype=np.float32).reshape(4, 3)
    ref = rng.normal(size=(4, 5, 2)).astype(np.float32)
    reuse.remember(["a", "b", "c", "d"], ref, scores, "m", [0.0] * 4, now=0.0)
    x = ref.copy()
    x[0, 0, 0] += 0.4  # a hit: the first element moved, by less than EPS
    x[1, 4, 1] += 0.6  # a miss the first element does not show
    x[2, 0, 0] += 0.6  # a miss the first element shows
    found = reuse.match(["a", "b", "c", "d", "e"], np.concatenate([x, x[:1]]), "m", 1.0)
    assert [f is not None for f in found] == [True, False, False, True, False]
    assert np.array_equal(found[0], scores[0]) and not found[0].flags.writeable
    for device, row in zip("abcd", x):  # one request at a time: the same answers
        assert (reuse.match_one(device, row, "m", 1.0) is not None) == (device in "ad")


def test_remember_copies_unless_the_caller_hands_its_arrays_over():
    reuse, x, scores = _reuse(), np.zeros((1, 2), np.float32), np.ones((1, 3), np.float32)
    reuse.remember(["d"], x, scores, "m", [0.0], now=0.0)
    x += 5.0
    scores += 1.0  # the caller's buffers are its own to reuse
    found = reuse.match(["d"], np.zeros((1, 2), np.float32), "m", 1.0)[0]
    assert found is not None and np.array_equal(found, [1, 1, 1]) and not found.flags.writeable
    reuse.remember_one("e", x[0], scores[0], "m", 0.0, now=0.0)  # a lone request's own arrays: kept, not copied
    kept = reuse.match_one("e", x[0], "m", 1.0)
    assert np.shares_memory(kept, scores) and not kept.flags.writeable
