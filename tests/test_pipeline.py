"""The pure pipeline with a fake interpreter (the only place fakes are allowed)."""

from __future__ import annotations

import json

import numpy as np

from daemon.config import InputConfig, RouteConfig
from daemon.pipeline import RoutePipeline, handle, infer_batch
from daemon.preprocess import Downsample

ROUTE = RouteConfig(name="r", subscribe="s/+", model="m", input=InputConfig(shape=(4,)),
                    preprocess=(Downsample(factor=2),), top_k=2, publish="o/{1}")
PIPE = RoutePipeline.build(ROUTE, "ab" * 32, ["low", "mid", "high"])


class FakeModel:
    """Scores a (N, 2) batch as softmax-like rows that favour class 2 when x[0] > 0."""

    def __init__(self):
        self.calls: list[int] = []

    def infer(self, batch: np.ndarray) -> np.ndarray:
        self.calls.append(len(batch))
        return np.array([[0.1, 0.2, 0.7] if row[0] > 0 else [0.6, 0.3, 0.1] for row in batch], np.float32)


class DictCache:
    def __init__(self):
        self.rows: dict[str, list[float]] = {}

    def get(self, key):
        return self.rows.get(key)

    def put(self, key, scores):
        self.rows[key] = list(scores)


def _request(values, **extra) -> bytes:
    return json.dumps({"id": "q", "data": values, **extra}).encode()


def test_result_has_the_contract_fields():
    model = FakeModel()
    reply = handle(PIPE, _request([1, 3, 0, 0]), model.infer, None, received_at=10.0, clock=lambda: 10.005)
    assert reply == {"id": "q", "route": "r", "model": "m", "model_sha256": "ab" * 6, "label": "high", "index": 2,
                     "score": 0.7, "top_k": [{"label": "high", "score": 0.7}, {"label": "mid", "score": 0.2}],
                     "cached": False, "latency_ms": 5.0}
    assert model.calls == [1]


def test_preprocessing_feeds_the_model():
    seen = []
    def infer(batch):
        seen.append(batch)
        return np.ones((1, 3), np.float32)

    handle(PIPE, _request([1, 3, 5, 7]), infer, None, 0.0, lambda: 0.0)
    assert seen[0].tolist() == [[2.0, 6.0]]


def test_cache_hit_skips_inference():
    model, cache = FakeModel(), DictCache()
    first = handle(PIPE, _request([1, 3, 0, 0]), model.infer, cache, 0.0, lambda: 0.0)
    second = handle(PIPE, _request([1, 3, 0, 0]), model.infer, cache, 0.0, lambda: 0.0)
    assert (first["cached"], second["cached"]) == (False, True) and model.calls == [1]
    assert first["top_k"] == second["top_k"]


def test_batch_reuses_hits_and_runs_misses_in_one_invoke():
    model, cache = FakeModel(), DictCache()
    tensors = np.array([[1.0, 0.0], [-1.0, 0.0], [2.0, 0.0]], np.float32)
    infer_batch(PIPE, tensors[:1], model.infer, cache)
    scores, cached = infer_batch(PIPE, tensors, model.infer, cache)
    assert cached == [True, False, False] and model.calls == [1, 2]
    assert scores.argmax(axis=1).tolist() == [2, 0, 2]


def test_bad_input_and_expiry_are_error_replies():
    model = FakeModel()
    bad = handle(PIPE, b"nope", model.infer, None, 0.0, lambda: 0.0)
    late = handle(PIPE, _request([1, 2, 3, 4], timeout_ms=5), model.infer, None, 0.0, lambda: 0.006)
    in_time = handle(PIPE, _request([1, 2, 3, 4], timeout_ms=5), model.infer, None, 0.0, lambda: 0.004)
    transport_deadline = handle(PIPE, _request([1, 2, 3, 4]), model.infer, None, 0.0, lambda: 2.0, deadline=1.0)
    assert bad["error"]["code"] == "bad_payload" and bad["id"] is None
    assert late["error"]["code"] == "expired" and late["id"] == "q"
    assert transport_deadline["error"]["code"] == "expired"
    assert "label" in in_time and model.calls == [1]
