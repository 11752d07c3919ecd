"""The pure request path: bytes -> decode -> preprocess -> cache -> infer -> result.

No threads, no MQTT, no clocks of its own: the caller passes the interpreter's `infer`
function, the cache (or None) and the times. This is the unit-test seam, and what
`validate` and the workers both run, so the daemon and the accuracy gate cannot
disagree. The core is batch-shaped (`infer_batch`), ready for micro-batching.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol, Sequence

import numpy as np

from daemon import codecs, preprocess
from daemon.cache import make_key
from daemon.config import RouteConfig
from daemon.errors import EXPIRED, PayloadError

InferFn = Callable[[np.ndarray], np.ndarray]
# Digits of a model's sha256 shown in results (contract: first 12 hex).
SHA_PREFIX = 12


class ScoreCache(Protocol):
    def get(self, key: str) -> Optional[list[float]]: ...
    def put(self, key: str, scores: Sequence[float]) -> None: ...


@dataclass(frozen=True)
class RoutePipeline:
    """Everything a route needs to turn a payload into a reply, minus the interpreter."""

    route: RouteConfig
    model_sha256: str
    labels: tuple[str, ...]
    preprocessing: str  # canonical JSON of the steps: the cache namespace

    @classmethod
    def build(cls, route: RouteConfig, model_sha256: str, labels: Sequence[str]) -> "RoutePipeline":
        canonical = json.dumps(preprocess.canonical(route.preprocess), sort_keys=True)
        return cls(route, model_sha256, tuple(labels), canonical)

    def decode(self, payload: bytes) -> codecs.Decoded:
        return codecs.decode(payload, self.route.input)

    def preprocess(self, batch: np.ndarray) -> np.ndarray:
        """(N, *input.shape) in sensor units -> (N, *model input shape) float32."""
        return preprocess.apply_steps(self.route.preprocess, batch)

    def postprocess(self, scores: np.ndarray, request_id: Any, cached: bool, latency_ms: float) -> dict:
        """One score vector -> the contract's result object."""
        order = np.argsort(-scores, kind="stable")
        top = order[: self.route.top_k]
        best = int(order[0])
        return {
            "id": request_id,
            "route": self.route.name,
            "model": self.route.model,
            "model_sha256": self.model_sha256[:SHA_PREFIX],
            "label": self.labels[best],
            "index": best,
            "score": round(float(scores[best]), 6),
            "top_k": [{"label": self.labels[int(i)], "score": round(float(scores[i]), 6)} for i in top],
            "cached": cached,
            "latency_ms": round(latency_ms, 3),
        }

    def error(self, request_id: Any, code: str, message: str) -> dict:
        return codecs.error_reply(request_id, self.route.name, code, message)


def infer_batch(pipe: RoutePipeline, tensors: np.ndarray, infer: InferFn,
                cache: Optional[ScoreCache]) -> tuple[np.ndarray, list[bool]]:
    """Scores for preprocessed tensors: cache hits are reused, misses run in one invoke."""
    n = tensors.shape[0]
    keys = [make_key(pipe.model_sha256, pipe.preprocessing, t) for t in tensors] if cache else []
    hits = [cache.get(k) for k in keys] if cache else [None] * n
    cached = [h is not None for h in hits]
    misses = [i for i in range(n) if not cached[i]]
    fresh = infer(tensors[misses]) if misses else np.empty((0, 0), np.float32)
    width = fresh.shape[1] if misses else len(next(h for h in hits if h is not None))
    scores = np.empty((n, width), dtype=np.float32)
    for row, i in enumerate(misses):
        scores[i] = fresh[row]
        if cache:
            cache.put(keys[i], fresh[row].tolist())
    for i in range(n):
        if cached[i]:
            scores[i] = hits[i]
    return scores, cached


def handle(pipe: RoutePipeline, payload: bytes, infer: InferFn, cache: Optional[ScoreCache],
           received_at: float, clock: Callable[[], float], deadline: Optional[float] = None) -> dict:
    """One request to one reply (a result, or an error for bad or late input).

    `deadline` (same clock as `received_at`) comes from the transport, e.g. an MQTT v5
    message expiry; a JSON request can tighten it with `timeout_ms`. Errors other than
    PayloadError propagate to the caller.
    """
    request_id = None
    try:
        decoded = pipe.decode(payload)
        request_id = decoded.request_id
        if decoded.timeout_ms is not None:
            own = received_at + decoded.timeout_ms / 1000.0
            deadline = own if deadline is None else min(deadline, own)
        if deadline is not None and clock() >= deadline:
            raise PayloadError(EXPIRED, f"deadline passed {(clock() - deadline) * 1000.0:.1f} ms before inference")
        tensors = pipe.preprocess(decoded.data[np.newaxis])
        scores, cached = infer_batch(pipe, tensors, infer, cache)
    except PayloadError as exc:
        return pipe.error(exc.request_id if exc.request_id is not None else request_id, exc.code, exc.message)
    return pipe.postprocess(scores[0], request_id, cached[0], (clock() - received_at) * 1000.0)
