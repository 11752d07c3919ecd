"""Routing and the life of one request: match -> queue (or shed) -> worker -> reply -> ack.

`on_message` runs on paho's network thread and is O(1) apart from the topic match:
no decoding, no I/O. A request that cannot be queued is answered `overloaded` right
away, so nothing is dropped silently. `process` runs on a worker thread with that
worker's own interpreters. Every request gets exactly one reply, and is acked only
after that reply was handed to the MQTT client.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Protocol, Sequence

from daemon import codecs, pipeline, topics
from daemon.config import WorkersConfig
from daemon.errors import INTERNAL, OVERLOADED
from daemon.mqtt import Inbound
from daemon.pipeline import RoutePipeline, ScoreCache
from daemon.runtime import Model
from daemon.stats import Stats, ThrottledLog
from daemon.workers import WorkerPool

logger = logging.getLogger(__name__)


class Transport(Protocol):
    def publish(self, topic: str, payload: bytes, retain: bool = False,
                correlation_data: Optional[bytes] = None) -> object: ...
    def ack(self, inbound: Inbound) -> None: ...


@dataclass(frozen=True)
class Job:
    pipe: RoutePipeline
    inbound: Inbound
    reply_topic: str


WorkerModels = Mapping[str, Model]  # one worker's private interpreters, by model name


class Dispatcher:
    """Owns the worker pool; turns inbound messages into exactly one reply each."""

    def __init__(self, pipes: Sequence[RoutePipeline], cache: Optional[ScoreCache], stats: Stats,
                 workers: WorkersConfig, make_models: Callable[[int], WorkerModels],
                 clock: Callable[[], float] = time.monotonic):
        self._pipes = tuple(pipes)
        self._cache = cache
        self._stats = stats
        self._clock = clock
        self._transport: Optional[Transport] = None
        self._log = ThrottledLog(logger)  # per-request problems, at most one line per key and interval
        self._pool: WorkerPool[Job, WorkerModels] = WorkerPool(
            workers.max, workers.queue, make_models, self.process)

    @property
    def filters(self) -> list[str]:
        return [p.route.subscribe for p in self._pipes]

    def attach(self, transport: Transport) -> None:
        self._transport = transport

    def start(self) -> None:
        self._pool.start()

    def stop(self, timeout_s: float) -> bool:
        return self._pool.stop(timeout_s)

    def on_message(self, inbound: Inbound) -> None:
        """paho thread: route and queue, or answer `overloaded` when the queue is full."""
        self._stats.incr("received")
        job = self._route(inbound)
        if job is None:
            # Only our own filters are subscribed, so this is a broker-side overlap; ack it.
            self._stats.incr("unroutable")
            self._log.warning("unroutable", "no route matches topic %r", inbound.topic)
            self._ack(inbound)
            return
        if not self._pool.submit(job):
            request_id = codecs.peek_id(inbound.payload, job.pipe.route.input)
            self._reply(job, job.pipe.error(request_id, OVERLOADED, "worker queue is full; retry later"))

    def _route(self, inbound: Inbound) -> Optional[Job]:
        for pipe in self._pipes:
            captures = topics.match(pipe.route.subscribe, inbound.topic)
            if captures is not None:
                return Job(pipe, inbound, topics.render(pipe.route.publish, inbound.topic, captures))
        return None

    def process(self, models: WorkerModels, job: Job) -> None:
        """Worker thread: the pure pipeline, then exactly one reply."""
        inbound = job.inbound
        deadline = inbound.received_at + inbound.expiry_s if inbound.expiry_s else None
        try:
            reply = pipeline.handle(job.pipe, inbound.payload, models[job.pipe.route.model].infer, self._cache,
                                    inbound.received_at, self._clock, deadline)
        except Exception as exc:  # a model or cache bug answers `internal`, it never kills the worker
            self._log.warning(f"internal:{job.pipe.route.name}", "internal error on %r", inbound.topic, exc_info=True)
            request_id = codecs.peek_id(inbound.payload, job.pipe.route.input)
            reply = job.pipe.error(request_id, INTERNAL, f"{type(exc).__name__}: {exc}")
        self._reply(job, reply)

    def _reply(self, job: Job, reply: dict) -> None:
        inbound = job.inbound
        error = reply.get("error")
        if error:
            self._stats.incr(f"errors.{error['code']}")
            self._log.warning(error["code"], "request on %r answered %s: %s", inbound.topic,
                              error["code"], error["message"])
        else:
            self._stats.incr("results")
            self._stats.incr("cache_hits" if reply["cached"] else "inferences")
            self._stats.observe_latency(reply["latency_ms"])
        topic = inbound.response_topic or job.reply_topic
        if self._transport is not None:
            self._transport.publish(topic, codecs.encode(reply), correlation_data=inbound.correlation_data)
        self._ack(inbound)

    def _ack(self, inbound: Inbound) -> None:
        if self._transport is not None:
            self._transport.ack(inbound)
