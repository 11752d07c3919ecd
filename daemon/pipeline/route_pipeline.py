"""A route's pipeline (everything a route needs to turn a payload into a reply, minus the
interpreter), the request and outcome of the pure request path, and the protocols it
sees the model, the cache and the reuse state through."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence

import numpy as np

from daemon.config.model_files import read_labels
from daemon.config.schema import Config, RouteConfig
from daemon.config.then import then_route
from daemon.errors import ModelError
from daemon.model import preprocess
from daemon.model.interface import Interface
from daemon.pipeline import codecs, postprocess, stages
from daemon.pipeline.geometry import Geometry
from daemon.pipeline.postprocess import ModelOutputs
from daemon.pipeline.stream_window import StreamItem

# Digits of a model's sha256 shown in results (contract: first 12 hex).
SHA_PREFIX = 12

Clock = Callable[[], float]
CacheEntry = tuple[bytes, np.ndarray]
CacheBatch = tuple[list[bytes], np.ndarray, float]
"""Results to store: their keys, their score rows, and the model's invoke cost per sample."""


class Digested(Protocol):
    """A loaded model, or what start-up keeps of one (daemon.model.residency.ModelInfo)."""

    sha256: str
    interface: Interface


class Runner(Protocol):
    """The model as the pipeline sees it (runtime.Model; a fake in unit tests)."""

    cost_per_sample_s: float
    num_outputs: int

    def quantize(self, batch: np.ndarray, as_is: bool = False) -> np.ndarray: ...
    def infer_quantized(self, q: np.ndarray) -> np.ndarray:
        """A new array, the caller's to keep: the reuse fast path remembers a single row as is."""
        ...
    def take_invokes(self) -> list[tuple[int, float]]:
        """(batch size, CPU seconds) of each invoke since the last call: the fleet canary's measure."""
        ...


class ScoreCache(Protocol):
    def get_many(self, keys: Sequence[bytes], invoke_cost_s: float = 0.0) -> list[Optional[np.ndarray]]: ...
    def put_many(self, items: Sequence[CacheEntry], invoke_cost_s: float = 0.0) -> None: ...


class ReuseState(Protocol):
    """A route's per-device fast path (daemon.pipeline.reuse.DeviceReuse), on preprocessed float rows."""

    def match(self, devices: Sequence[Optional[str]], x: np.ndarray, model_sha256: str,
              now: float) -> list[Optional[np.ndarray]]: ...
    def remember(self, devices: Sequence[Optional[str]], x: np.ndarray, scores: np.ndarray,
                 model_sha256: str, received_at: Sequence[float], now: float) -> None: ...
    def match_one(self, device: Optional[str], x: np.ndarray, model_sha256: str,
                  now: float) -> Optional[np.ndarray]: ...
    def in_batch(self, cost_per_sample_s: float) -> bool: ...
    def forget(self, devices: Sequence[Optional[str]]) -> None: ...
    def remember_one(self, device: Optional[str], x: np.ndarray, scores: np.ndarray, model_sha256: str,
                     received_at: float, now: float) -> None: ...


@dataclass(slots=True)  # one per request: slotted, not frozen (frozen: 724 vs 197 ns to build); never assigned
class Request:
    payload: bytes
    received_at: float
    deadline: Optional[float] = None
    """From the transport (an MQTT v5 message expiry), same clock; `timeout_ms` can tighten it."""
    device: Optional[str] = None
    """The request topic: the device whose last input the reuse fast path compares with."""
    item: Optional[StreamItem] = None
    """A stream's window, decoded already (daemon/pipeline/stream_window.py); None: decode `payload`."""


@dataclass
class Outcome:
    """One reply per request, in order, plus what the caller stores in the cache after replying."""

    replies: list[dict]
    fresh: list[CacheBatch] = field(default_factory=list)
    stages: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    """Counters to add to the stats (a chain's inputs per stage: daemon/pipeline/stages.py)."""
    drift: list = field(default_factory=list)
    """Answers for the drift monitor beyond the replies' own (a chain's earlier stages)."""


@dataclass(frozen=True)
class RoutePipeline:
    """Everything a route needs to turn a payload into a reply, minus the interpreter."""

    route: RouteConfig
    model_sha256: str
    labels: tuple[str, ...]
    """By output index (or class id); an index past them is named by its number."""
    outputs: Optional[ModelOutputs] = None
    """Where each of the model's outputs lies in its flat row (None: one output, a classifier's)."""
    pixels_as_is: bool = False
    """A uint8 image model fed the decoded pixels themselves (no preprocess steps), not quantized."""
    escalate_to: Optional["RoutePipeline"] = None
    """`escalate.to_model`: the same route on the heavier model (daemon/serve/cascade.py)."""
    then_to: Optional["RoutePipeline"] = None
    """`then.route`: the classify route whose model labels each box (daemon/pipeline/sub_labels.py)."""
    chain: Optional[stages.ChainPlan] = None
    """`stages`: the models after the route's own, in order (daemon/pipeline/stages.py); `outputs`
    and `labels` are then the last stage's."""

    @classmethod
    def build(cls, route: RouteConfig, model_sha256: str, labels: Sequence[str],
              interface: Optional[Interface] = None) -> "RoutePipeline":
        if interface is None:
            return cls(route, model_sha256, tuple(labels))
        as_is = (route.input.format == "image" and not route.preprocess
                 and interface.inputs[0].dtype == np.uint8)
        return cls(route, model_sha256, tuple(labels), ModelOutputs.of(interface), as_is)

    @property
    def key_sha256(self) -> str:
        """The cache key's model part: the model's digest, or the whole chain's (any stage's model
        or settings changed gives new keys)."""
        return self.model_sha256 if self.chain is None else self.chain.sha256

    def label(self, index: int) -> str:
        return self.labels[index] if 0 <= index < len(self.labels) else str(index)

    def decode(self, payload: bytes, check_finite: bool = True) -> codecs.Decoded:
        return codecs.decode(payload, self.route.input, check_finite)

    def decode_many(self, payloads: Sequence[bytes]) -> codecs.DecodedBatch:
        """A group of this route's payloads in one array, not yet checked finite (codecs.decode_many)."""
        return codecs.decode_many(payloads, self.route.input)

    def preprocess(self, batch: np.ndarray) -> np.ndarray:
        """(N, *input.shape) in sensor units -> (N, *model input shape) float32; a uint8 image
        model's pixels stay as they are (no steps, and no copies of a picture)."""
        if self.pixels_as_is:
            return batch
        return preprocess.apply_steps(self.route.preprocess, batch)

    def far_rows(self, payloads: Sequence[bytes]) -> tuple[np.ndarray, set[int]]:
        """`escalate.to_v2`: the payloads decoded and preprocessed with the far model's steps
        (`escalate.preprocess`, else the route's), one float32 row each; the positions that fail
        to decode are in the set (their rows zero)."""
        batch = self.decode_many(payloads)
        good = [i for i, _ in batch.decoded]
        failed = set(range(len(payloads))) - set(good)
        if not good:
            return np.zeros((len(payloads), 0), dtype=np.float32), failed
        far = self.route.escalate.far_route(self.route)
        rows = preprocess.apply_steps(far.preprocess, batch.x).astype(np.float32, copy=False)
        out = np.zeros((len(payloads), *rows.shape[1:]), dtype=np.float32)
        out[good] = rows
        return out, failed

    def postprocess(self, scores: np.ndarray, request_id: Any, cached: bool, latency_ms: float,
                    order: Optional[np.ndarray] = None, reused: Optional[bool] = None,
                    x: Optional[np.ndarray] = None, geometry: Optional[Geometry] = None) -> dict:
        """One row of outputs (and its descending order, when the caller sorted a batch of
        classifier scores) -> a result. `x` and `geometry`: see postprocess.fields."""
        reply = {"id": request_id, "route": self.route.name, "model": self.route.model,
                 "model_sha256": self.model_sha256[:SHA_PREFIX]}
        if self.chain is not None:
            reply.update(stages.reply_fields(self.route, self.label, self.outputs, scores, self.chain))
        else:
            reply.update(postprocess.fields(self.route, self.label, self.outputs, scores, order, x, geometry))
        reply["cached"] = cached
        reply["latency_ms"] = round(latency_ms, 3)
        if reused is not None:  # only on routes with `reuse` configured
            reply["reused"] = reused
        return reply

    def error(self, request_id: Any, code: str, message: str) -> dict:
        return codecs.error_reply(request_id, self.route.name, code, message)

    def error_for(self, payload: bytes, code: str, message: str) -> dict:
        """An error reply to a request not decoded (shed, or failed): its id read by a prefix scan."""
        return self.error(codecs.scan_id(payload, self.route.input), code, message)


def route_pipeline(config: Config, route: RouteConfig, model: Digested,
                   models: Optional[Mapping[str, Digested]] = None) -> RoutePipeline:
    """The route's pipeline with its model's labels: the one place a labels file becomes a pipeline.
    A route with `stages` answers with its last stage's model (its labels and outputs), found in `models`."""
    last = model if not route.stages else (models or {})[route.stages[-1].model]
    mc = config.models[route.stages[-1].model if route.stages else route.model]
    labels = read_labels(mc.labels)
    if labels is None and mc.labels is not None:
        raise ModelError(mc.labels, "labels file not found")
    pipe = RoutePipeline.build(route, model.sha256, labels.names if labels else (), model.interface)
    if not route.stages:
        return pipe
    found = [(models[s.model].sha256, models[s.model].interface.outputs[0].sample_shape) for s in route.stages]
    chain = stages.plan(route, model.sha256, model.interface.outputs[0].sample_shape, found)
    return dataclasses.replace(pipe, outputs=ModelOutputs.of(last.interface), chain=chain)


def route_pipelines(config: Config, models: Mapping[str, Digested]) -> list[RoutePipeline]:
    """Every route's pipeline, with its `escalate.to_model` tier's (daemon/serve/cascade.py) and its
    `then` route's (daemon/pipeline/sub_labels.py)."""
    pipes = []
    for route in config.routes:
        pipe = route_pipeline(config, route, models[route.model], models)
        if route.escalate is not None and route.escalate.to_model is not None:
            large_route = route.escalate.large_route(route)
            pipe = dataclasses.replace(pipe, escalate_to=route_pipeline(config, large_route, models[large_route.model]))
        if route.then is not None:
            then = then_route(config.routes, route.then)
            pipe = dataclasses.replace(pipe, then_to=route_pipeline(config, then, models[then.model]))
        pipes.append(pipe)
    return pipes
