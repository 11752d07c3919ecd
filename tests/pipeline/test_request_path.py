"""The pure pipeline with a fake interpreter (the only place fakes are allowed)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from daemon.config.schema import InputConfig, RouteConfig
from daemon.pipeline.route_pipeline import Request, RoutePipeline
from daemon.pipeline.request_path import handle, handle_batch
from daemon.model.preprocess import Downsample
from tests.fakes import DictCache

ROUTE = RouteConfig(name="r", subscribe="s/+", model="m", input=InputConfig(shape=(4,)),
                    preprocess=(Downsample(factor=2),), top_k=2, publish="o/{1}")
PIPE = RoutePipeline.build(ROUTE, "ab" * 32, ["low", "mid", "high"])


class FakeModel:
    """Scores a (N, 2) batch as softmax-like rows that favour class 2 when x[0] > 0.

    Its "quantization" rounds to tenths, so inputs equal after rounding share a cache key."""

    cost_per_sample_s = 0.0
    num_outputs = 3

    def __init__(self):
        self.calls: list[int] = []
        self.seen: list[np.ndarray] = []

    def quantize(self, batch: np.ndarray, as_is: bool = False) -> np.ndarray:
        self.seen.append(batch)
        return np.round(batch * 10).astype(np.int8)

    def infer_quantized(self, q: np.ndarray) -> np.ndarray:
        self.calls.append(len(q))
        return np.array([[0.1, 0.2, 0.7] if row[0] > 0 else [0.6, 0.3, 0.1] for row in q], np.float32)


def _request(values, **extra) -> bytes:
    return json.dumps({"id": "q", "data": values, **extra}).encode()


def test_result_has_the_contract_fields():
    model = FakeModel()
    reply = handle(PIPE, _request([1, 3, 0, 0]), model, None, received_at=10.0, clock=lambda: 10.005)
    assert reply == {"id": "q", "route": "r", "model": "m", "model_sha256": "ab" * 6, "label": "high", "index": 2,
                     "score": 0.7, "top_k": [{"label": "high", "score": 0.7}, {"label": "mid", "score": 0.2}],
                     "cached": False, "latency_ms": 5.0}
    assert model.calls == [1]


def test_preprocessing_feeds_the_model():
    model = FakeModel()
    handle(PIPE, _request([1, 3, 5, 7]), model, None, 0.0, lambda: 0.0)
    assert model.seen[0].tolist() == [[2.0, 6.0]]


def test_cache_hit_skips_inference_and_int8_equal_inputs_hit():
    model, cache = FakeModel(), DictCache()
    first = handle(PIPE, _request([1, 3, 0, 0]), model, cache, 0.0, lambda: 0.0)
    second = handle(PIPE, _request([1, 3, 0, 0]), model, cache, 0.0, lambda: 0.0)
    near = handle(PIPE, _request([1.01, 2.99, 0, 0]), model, cache, 0.0, lambda: 0.0)  # same "int8" input
    assert (first["cached"], second["cached"], near["cached"]) == (False, True, True) and model.calls == [1]
    assert first["top_k"] == second["top_k"] == near["top_k"]


def test_the_key_holds_the_model_so_another_model_never_gets_its_answers():
    """The one place the daemon makes keys: a key without the model's digest would answer the
    swapped-in model from the old model's entry (tests/integration/test_reload.py end to end)."""
    model, cache = FakeModel(), DictCache()
    other = dataclasses.replace(PIPE, model_sha256="cd" * 32)
    assert handle(PIPE, _request([1, 3, 0, 0]), model, cache, 0.0, lambda: 0.0)["cached"] is False
    assert handle(other, _request([1, 3, 0, 0]), model, cache, 0.0, lambda: 0.0)["cached"] is False
    assert handle(other, _request([1, 3, 0, 0]), model, cache, 0.0, lambda: 0.0)["cached"] is True
    assert handle(PIPE, _request([1, 3, 0, 0]), model, cache, 0.0, lambda: 0.0)["cached"] is True
    assert model.calls == [1, 1] and len(cache.rows) == 2


def test_a_batch_reuses_hits_runs_misses_in_one_invoke_and_returns_the_new_entries():
    model, cache = FakeModel(), DictCache()
    handle(PIPE, _request([1, 1, 0, 0]), model, cache, 0.0, lambda: 0.0)
    requests = [Request(_request(v), 0.0) for v in ([1, 1, 0, 0], [-1, -1, 0, 0], [2, 2, 0, 0])]
    outcome = handle_batch(PIPE, requests, model, cache, lambda: 0.0)
    assert [r["cached"] for r in outcome.replies] == [True, False, False] and model.calls == [1, 2]
    assert [r["index"] for r in outcome.replies] == [2, 0, 2]
    [(keys, scores, cost)] = outcome.fresh  # one group per batch: keys, score rows, the model's cost
    assert len(keys) == len(scores) == 2 and cost == model.cost_per_sample_s
    assert len(cache.rows) == 1  # the caller stores them, after replying
    assert set(outcome.stages) == {"decode", "preprocess", "infer", "postprocess"}


def test_a_bad_request_in_a_batch_gets_its_error_and_the_others_their_results():
    model = FakeModel()
    requests = [Request(_request([1, 1, 0, 0]), 0.0), Request(b"nope", 0.0), Request(_request([1, 2]), 0.0),
                Request(_request([-1, -1, 0, 0], timeout_ms=5), 0.0), Request(_request([1e39, 1, 0, 0]), 0.0),
                Request(_request([-1, -1, 0, 0]), 0.0)]
    replies = handle_batch(PIPE, requests, model, None, lambda: 0.006).replies
    codes = [r.get("error", {}).get("code") for r in replies]
    assert codes == [None, "bad_payload", "bad_shape", "expired", "bad_payload", None]  # 1e39 is inf in float32
    assert "NaN or infinity" in replies[4]["error"]["message"] and replies[4]["id"] == "q"
    assert replies[0]["label"] == "high" and replies[5]["label"] == "low" and model.calls == [2]


def test_bad_input_and_expiry_are_error_replies():
    model = FakeModel()
    bad = handle(PIPE, b"nope", model, None, 0.0, lambda: 0.0)
    late = handle(PIPE, _request([1, 2, 3, 4], timeout_ms=5), model, None, 0.0, lambda: 0.006)
    in_time = handle(PIPE, _request([1, 2, 3, 4], timeout_ms=5), model, None, 0.0, lambda: 0.004)
    transport_deadline = handle(PIPE, _request([1, 2, 3, 4]), model, None, 0.0, lambda: 2.0, deadline=1.0)
    assert bad["error"]["code"] == "bad_payload" and bad["id"] is None
    assert late["error"]["code"] == "expired" and late["id"] == "q"
    assert transport_deadline["error"]["code"] == "expired"
    assert "label" in in_time and model.calls == [1]


def test_a_request_its_batch_would_make_late_is_expired_and_the_rest_are_served():
    model = FakeModel()
    requests = [Request(_request([1, 1, 0, 0]), 0.0, deadline=0.5),  # 0.5 s left, the batch takes 0.3
                Request(_request([1, 1, 0, 0], timeout_ms=200), 0.0),  # its own timeout: 0.2 s left
                Request(_request([-1, -1, 0, 0]), 0.0, deadline=0.25),
                Request(_request([-1, -1, 0, 0]), 0.0)]  # no deadline
    replies = handle_batch(PIPE, requests, model, None, lambda: 0.0, finish_s=0.3).replies
    assert [r.get("error", {}).get("code") for r in replies] == [None, "expired", "expired", None]
    assert "its batch is expected to take 300.0 ms" in replies[1]["error"]["message"]
    assert model.calls == [2]  # only the two that can make it were run
