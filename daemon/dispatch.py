"""Routing and the life of a request: match -> admit (or shed) -> batch -> reply -> ack.

`on_message` runs on paho's network thread and is O(1) apart from the topic match
(remembered per topic): no decoding, no I/O. A request that admission refuses is
answered `overloaded` or `expired` right away, with its id read by a prefix scan, so
nothing is dropped silently. `process` runs on a worker thread with that worker's own
interpreters, on a batch of jobs: per route, the pure pipeline, then every reply is
published and each request acked after its reply; cache writes go last, off the
reply path. Every request gets exactly one reply.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import Counter, OrderedDict
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Protocol, Sequence

from daemon import codecs, pipeline, topics
from daemon.cascade import Cascade, RemoteCascade
from daemon.admission import Admission, Refusal, Ticket
from daemon.autoscale import Autoscaler
from daemon.config import BatchingConfig, WorkersConfig
from daemon.errors import INTERNAL, RATE_LIMITED, SUPERSEDED
from daemon.mqtt import Inbound
from daemon.pipeline import Outcome, Request, RoutePipeline, ScoreCache
from daemon.rate import COALESCE_LATEST, DeviceRate
from daemon.reuse import DeviceReuse
from daemon.runtime import Model
from daemon.stats import RESULT, Stats, ThrottledLog
from daemon.workers import WorkerPool

logger = logging.getLogger(__name__)

# Request topics whose route and reply topic are remembered (devices seen recently).
ROUTE_MEMO_SIZE = 4096


class Transport(Protocol):
    def publish(self, topic: str, payload: bytes, retain: bool = False,
                correlation_data: Optional[bytes] = None) -> object: ...
    def ack(self, inbound: Inbound) -> None: ...
    def reply(self, topic: str, payload: bytes, inbound: Inbound) -> None: ...
    def batch(self) -> AbstractContextManager: ...


@dataclass(frozen=True)
class Job:
    pipe: RoutePipeline
    inbound: Inbound
    reply_topic: str
    ticket: Ticket
    seq: int = 0  # coalesce: its place among its device's jobs (daemon/rate.py); 0 never superseded


WorkerModels = Mapping[str, Model]  # one worker's private interpreters, by model name


@dataclass(frozen=True)
class _Context:
    """What one worker runs a batch with: its interpreters and the pipelines that match them
    (model digest, labels), swapped together on a reload so a batch never mixes them."""

    models: WorkerModels
    pipes: Mapping[str, RoutePipeline]  # by route name


@dataclass
class _Tally:
    """What a batch's replies add to the stats, recorded under one lock at the end."""

    counts: Counter = field(default_factory=Counter)
    latencies_ms: list = field(default_factory=list)
    outcomes: Counter = field(default_factory=Counter)


class Dispatcher:
    """Owns admission and the worker pool; turns inbound messages into exactly one reply each."""

    def __init__(self, pipes: Sequence[RoutePipeline], cache: Optional[ScoreCache], stats: Stats,
                 workers: WorkersConfig, make_models: Callable[[int], WorkerModels],
                 batching: BatchingConfig = BatchingConfig(), clock: Callable[[], float] = time.monotonic,
                 escalation_topic: Optional[str] = None):
        """`escalation_topic`: where far tiers answer this node's `escalate.to_topic` requests."""
        self._pipes = tuple(pipes)
        self._cache = cache
        self._stats = stats
        self._clock = clock
        self._transport: Optional[Transport] = None
        self._log = ThrottledLog(logger)  # per-request problems, at most one line per key and interval
        self._cascade = Cascade(clock)
        remote = any(p.route.escalate and p.route.escalate.to_topic for p in self._pipes) and escalation_topic
        self._remote = RemoteCascade(escalation_topic, self._send_one, clock) if remote else None
        self._routes: OrderedDict[str, tuple[RoutePipeline, str]] = OrderedDict()
        self.rate = DeviceRate(stats)  # per-device min_interval_ms and coalesce state
        # Per-device fast path, by route name; kept across reloads (entries name their model digest).
        self._reuse = {p.route.name: DeviceReuse(p.route.reuse) for p in self._pipes if p.route.reuse is not None}
        self.admission = Admission(workers.queue_bytes, workers.max_wait_ms / 1000.0, workers.min,
                                   batching.max_batch, clock)
        pipes_by_name = {p.route.name: p for p in self._pipes}
        self._pool: WorkerPool[Job, _Context] = WorkerPool(
            workers.max, lambda i: _Context(make_models(i), pipes_by_name), self.process, batching.max_batch,
            batching.max_delay_ms / 1000.0,
            deadline_of=lambda job: job.inbound.deadline, arrival_of=lambda job: job.inbound.received_at, clock=clock,
            scaler=Autoscaler(workers.min, workers.max, workers.scale_up_wait_ms / 1000.0, workers.scale_down_after_s,
                              clock),
            on_resize=self.admission.set_workers)

    @property
    def filters(self) -> list[str]:
        return [p.route.subscribe for p in self._pipes] + ([self._remote.response_topic] if self._remote else [])

    @property
    def pool(self) -> WorkerPool:
        return self._pool

    def reuse_snapshot(self) -> dict:
        """{route: {devices, hits, misses, skipped}} for the routes with `reuse` configured."""
        return {name: state.snapshot() for name, state in self._reuse.items()}

    def attach(self, transport: Transport) -> None:
        self._transport = transport

    def start(self) -> None:
        self._pool.start()
        if self._remote is not None:
            self._remote.start()

    def stop(self, timeout_s: float) -> bool:
        stopped = self._pool.stop(timeout_s)
        if self._remote is not None:
            self._remote.stop()  # parked escalations get their local answer: none left unanswered
        return stopped

    def swap(self, pipes: Sequence[RoutePipeline], make_models: Callable[[int], WorkerModels]) -> None:
        """New models and pipelines for the same routes (a reload): built here, then each worker
        takes its own before its next batch; a batch in flight finishes on the old ones."""
        by_name = {p.route.name: p for p in pipes}
        self._pool.replace_contexts(lambda i: _Context(make_models(i), by_name))
        self._pipes = tuple(pipes)
        self._routes = OrderedDict()  # remembered (pipe, reply topic) pairs name the old pipes

    def on_message(self, inbound: Inbound) -> None:
        """paho thread: route and admit, or answer at once (O(1): no parsing)."""
        if self._remote is not None and inbound.topic == self._remote.response_topic:
            if not self._remote.on_response(inbound):  # a far tier's answer to an escalation
                self._stats.incr("escalations_late")  # after its timeout (or from an earlier run): dropped
            self._ack(inbound)
            return
        self._stats.incr("received")
        found = self._route(inbound.topic)
        if found is None:
            # Only our own filters are subscribed, so this is a broker-side overlap; ack it.
            self._stats.incr("unroutable")
            self._log.warning("unroutable", "no route matches topic %r", inbound.topic)
            self._ack(inbound)
            return
        pipe, reply_topic = found
        route = pipe.route
        if self.rate.too_soon(inbound.topic, route.min_interval_ms, self._clock()):
            self._shed(pipe, inbound, reply_topic, Refusal(
                RATE_LIMITED, f"this device sent again within routes[].min_interval_ms ({route.min_interval_ms:g})"))
            return
        verdict = self.admission.admit(route.name, len(inbound.payload), inbound.deadline)
        if isinstance(verdict, Refusal):
            self._shed(pipe, inbound, reply_topic, verdict)
            return
        coalesce = route.coalesce == COALESCE_LATEST
        seq = self.rate.admitted(inbound.topic, self._clock(), coalesce) if coalesce or route.min_interval_ms else 0
        if not self._pool.submit(Job(pipe, inbound, reply_topic, verdict, seq)):
            self.admission.release(verdict)  # stopping: leave it unacked for redelivery
            self.rate.withdraw(inbound.topic, seq)

    def _shed(self, pipe: RoutePipeline, inbound: Inbound, reply_topic: str, refusal: Refusal) -> None:
        self._send_one(inbound, reply_topic, _error(pipe, inbound, refusal.code, refusal.message))

    def _route(self, topic: str) -> Optional[tuple[RoutePipeline, str]]:
        found = self._routes.get(topic)
        if found is not None:
            return found
        for pipe in self._pipes:
            captures = topics.match(pipe.route.subscribe, topic)
            if captures is not None:
                found = (pipe, topics.render(pipe.route.publish, topic, captures))
                self._routes[topic] = found
                if len(self._routes) > ROUTE_MEMO_SIZE:
                    self._routes.popitem(last=False)
                return found
        return None

    def process(self, context: _Context, jobs: list[Job]) -> None:
        """Worker thread: a batch of jobs -> per route, the pure pipeline, then one reply each."""
        now = self._clock()
        groups: dict[str, list[Job]] = {}
        stale = []
        for job in jobs:
            self.admission.release(job.ticket)
            if self.rate.superseded(job.inbound.topic, job.seq):
                stale.append(job)
            else:
                groups.setdefault(job.pipe.route.name, []).append(job)
        self._stats.observe_stages("queue", [now - job.inbound.received_at for job in jobs])
        if stale:
            self._supersede(stale)
        self._stats.observe_batch(len(jobs))
        for group in groups.values():
            pipe = context.pipes[group[0].pipe.route.name]  # a job queued before a reload runs on the new
            self._process_group(context.models[pipe.route.model], pipe, group, context.models)

    def _supersede(self, jobs: list[Job]) -> None:
        """coalesce: latest: answer the jobs a newer one of the same device replaces, unrun."""
        tally = _Tally()
        with self._transport.batch() if self._transport is not None else nullcontext():
            for job in jobs:
                reply = _error(job.pipe, job.inbound, SUPERSEDED, "a newer request from this device is queued")
                self._send(job.inbound, job.reply_topic, reply, tally)
        self._stats.record(tally.counts, (), tally.outcomes)

    def _process_group(self, model: Model, pipe: RoutePipeline, group: list[Job], models: WorkerModels) -> None:
        started = self._clock()
        requests = [Request(j.inbound.payload, j.inbound.received_at, j.inbound.deadline, j.inbound.topic)
                    for j in group]
        outcome = self._run_pipeline(model, pipe, group, requests)
        if pipe.route.escalate is not None:
            outcome = self._escalate(pipe, group, requests, outcome, models)
        for stage, seconds in outcome.stages.items():
            self._stats.observe_stage(stage, seconds)
        published = self._clock()
        tally = _Tally()
        with self._transport.batch() if self._transport is not None else nullcontext():
            for job, reply in zip(group, outcome.replies):
                if reply is not None:  # None: escalated, answered later (daemon/cascade.py)
                    self._send(job.inbound, job.reply_topic, reply, tally)
        done = self._clock()
        self._stats.record(tally.counts, tally.latencies_ms, tally.outcomes)
        self._stats.observe_stage("publish", done - published)
        self.admission.observe(pipe.route.name, len(group), done - started)
        if self._cache is not None and outcome.fresh:
            self._cache.put_many(outcome.fresh)  # after the replies: never on the reply path

    def _escalate(self, pipe: RoutePipeline, group: list[Job], requests: list[Request], outcome: Outcome,
                  models: WorkerModels) -> Outcome:
        """The confidence cascade (daemon/cascade.py): `to_model` reruns the low-confidence requests on
        the heavier model; `to_topic` parks them (their reply becomes None) until the far tier answers."""
        if pipe.escalate_to is not None:
            return self._cascade.run_local(pipe, pipe.escalate_to, requests, outcome,
                                           models[pipe.escalate_to.route.model], self._cache)
        if self._remote is not None and self._transport is not None and pipe.route.escalate.to_topic is not None:
            self._remote.hand_off(self._cascade, pipe, group, outcome.replies, self._transport.publish)
        return outcome

    def _run_pipeline(self, model: Model, pipe: RoutePipeline, group: list[Job], requests: list[Request]) -> Outcome:
        try:
            return pipeline.handle_batch(pipe, requests, model, self._cache, self._clock,
                                         self._reuse.get(pipe.route.name))
        except Exception:  # a model or cache bug: isolate the request that causes it
            if len(group) == 1:
                return Outcome([self._internal(group[0], sys.exc_info()[1])])
            outcomes = [self._run_pipeline(model, pipe, [job], [request]) for job, request in zip(group, requests)]
            return Outcome([o.replies[0] for o in outcomes], [e for o in outcomes for e in o.fresh])

    def _internal(self, job: Job, exc: Optional[BaseException]) -> dict:
        """The `internal` reply for a request whose processing raised (logged, throttled)."""
        route = job.pipe.route.name
        self._log.warning(f"internal:{route}", "internal error on %r", job.inbound.topic, exc_info=True)
        return _error(job.pipe, job.inbound, INTERNAL, f"{type(exc).__name__}: {exc}")

    def _send(self, inbound: Inbound, reply_topic: str, reply: dict, tally: "_Tally") -> None:
        error = reply.get("error")
        tally.outcomes[(reply.get("route") or "", error["code"] if error else RESULT)] += 1
        if error:
            self._log.warning(error["code"], "request on %r answered %s: %s", inbound.topic,
                              error["code"], error["message"])
        else:
            tally.counts["cache_hits" if reply["cached"] else "inferences"] += 1
            if "tier" in reply:  # a cascade route (daemon/cascade.py): who answered, and any fallback
                tally.counts[f"tier_{reply['tier']}"] += 1
                if "escalation" in reply:
                    tally.counts[f"escalation_{reply['escalation']}"] += 1
            tally.latencies_ms.append(reply["latency_ms"])
        topic = inbound.response_topic or reply_topic
        if self._transport is not None:
            self._transport.reply(topic, codecs.encode(reply), inbound)  # acks it once the reply is safe

    def _send_one(self, inbound: Inbound, reply_topic: str, reply: dict) -> None:
        """A reply made off the worker path (an escalation's answer, or its local fallback)."""
        tally = _Tally()
        self._send(inbound, reply_topic, reply, tally)
        self._stats.record(tally.counts, tally.latencies_ms, tally.outcomes)

    def _ack(self, inbound: Inbound) -> None:
        if self._transport is not None:
            self._transport.ack(inbound)


def _error(pipe: RoutePipeline, inbound: Inbound, code: str, message: str) -> dict:
    """An error reply to a request, its id read by a prefix scan (no full parse)."""
    return pipe.error(codecs.scan_id(inbound.payload, pipe.route.input), code, message)
