"""The worker side of serving: a batch of jobs -> per route, the pure pipeline, then one reply each.

It runs on a worker thread with that worker's own interpreters (jobs.WorkerContext). Per
route: the pure request path (daemon/pipeline/request_path.py), the cascade when the
route has one, every reply published and each request acked after its reply; then the
group's time to the admission's cost fit, and last the cache writes, off the reply path.
Every request gets exactly one reply: a request whose processing raises gets `internal`.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Callable, Mapping, Optional

from daemon.errors import INTERNAL, SUPERSEDED
from daemon.obs.model_watch import ModelWatch
from daemon.obs.stats import Stats
from daemon.pipeline import request_path, sub_labels
from daemon.pipeline.stages import runners_for
from daemon.pipeline.route_pipeline import SHA_PREFIX, Outcome, Request, ReuseState, RoutePipeline, Runner, ScoreCache
from daemon.serve.admission import Admission
from daemon.serve.cascade import Cascade, RemoteCascade
from daemon.serve.far_v2 import V2Cascade
from daemon.serve.jobs import Job, WorkerContext, WorkerModels
from daemon.serve.rate import DeviceRate
from daemon.serve.replies import Replier, Tally, error

logger = logging.getLogger(__name__)

CROPS_CLASSIFIED = "crops_classified"  # stats counts, `crops_classified.<route>`: boxes given a sub_label


class BatchProcessor:
    """`process` is the worker pool's job function; shared by the workers, holding no interpreter."""

    def __init__(self, admission: Admission, rate: DeviceRate, replier: Replier, stats: Stats,
                 cache: Optional[ScoreCache], reuse: Mapping[str, ReuseState], remote: Optional[RemoteCascade] = None,
                 clock: Callable[[], float] = time.monotonic, watch: Optional[ModelWatch] = None,
                 far_v2: Optional[V2Cascade] = None):
        """`reuse`: the per-device fast path by route name; `remote` and `far_v2`: the far tiers
        (`to_topic`, `to_v2`);
        `watch`: each release's invoke times, for the fleet canary (daemon/obs/model_watch.py)."""
        self._watch = watch
        self._admission = admission
        self._rate = rate
        self._replier = replier
        self._stats = stats
        self._cache = cache
        self._reuse = reuse
        self._cascade = Cascade(clock, replier.log)
        self._remote = remote
        self._far_v2 = far_v2
        self._clock = clock

    def process(self, context: WorkerContext, jobs: list[Job]) -> None:
        now = self._clock()
        groups: dict[str, list[Job]] = {}
        stale = []
        for job in jobs:
            self._admission.release(job.ticket)
            if self._rate.superseded(job.inbound.topic, job.seq):
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
        tally = Tally()
        with self._replier.batch():
            for job in jobs:
                reply = error(job.pipe, job.inbound, SUPERSEDED, "a newer request from this device is queued")
                self._replier.send(job.inbound, job.reply_topic, reply, tally)
        self._replier.record(tally)

    def _process_group(self, model: Runner, pipe: RoutePipeline, group: list[Job], models: WorkerModels) -> None:
        started = self._clock()
        # The device whose input `reuse` compares: the request topic, or a window's stream (several
        # streams may share a topic when a JSON field names them).
        requests = [Request(j.inbound.payload, j.inbound.received_at, j.inbound.deadline,
                            j.inbound.topic if j.item is None else j.item.stream, j.item) for j in group]
        outcome = self._run_pipeline(model, pipe, group, requests, runners_for(pipe.chain, models))
        if pipe.then_to is not None:
            self._sub_labels(pipe, requests, outcome, models[pipe.then_to.route.model])
        if pipe.route.escalate is not None:
            outcome = self._escalate(pipe, group, requests, outcome, models)
        for stage, seconds in outcome.stages.items():
            self._stats.observe_stage(stage, seconds)
        for name, n in outcome.counts.items():
            self._stats.incr(name, n)
        if self._watch is not None:  # the invokes' CPU time (a cache hit or a reused answer ran none)
            self._watch.invoked(pipe.model_sha256[:SHA_PREFIX], model.take_invokes())
            for stage in pipe.chain.stages if pipe.chain is not None else ():
                self._watch.invoked(stage.sha256[:SHA_PREFIX], models[stage.config.model].take_invokes())
        published = self._clock()
        tally = Tally()
        if outcome.drift and self._replier.watches_drift:  # a chain's earlier stages (stages.py)
            tally.answers.extend(outcome.drift)
        with self._replier.batch():
            for job, reply in zip(group, outcome.replies):
                if reply is not None:  # None: escalated, answered later (cascade.py)
                    self._replier.send(job.inbound, job.reply_topic, reply, tally)
        done = self._clock()
        self._replier.record(tally)
        self._stats.observe_stage("publish", done - published)
        self._admission.observe(pipe.route.name, len(group), done - started)
        request_path.store(self._cache, outcome)  # after the replies: never on the reply path

    def _sub_labels(self, pipe: RoutePipeline, requests: list[Request], outcome: Outcome, model: Runner) -> None:
        """`then:` each result's boxes classified by the sub-model (daemon/pipeline/sub_labels.py)."""
        try:
            classified = sub_labels.classify_boxes(pipe, requests, outcome, model, self._clock)
        except Exception:  # the sub-model failing must not cost the requests their boxes
            self._replier.log.warning(f"sub_labels:{pipe.route.name}", "route %r: classifying the boxes failed; "
                                      "their boxes go with sub_label null", pipe.route.name, exc_info=True)
            sub_labels.unlabelled(outcome)
            return
        self._stats.incr(f"{CROPS_CLASSIFIED}.{pipe.route.name}", classified)
        if self._watch is not None:  # the classifier's invokes, under its own release
            self._watch.invoked(pipe.then_to.model_sha256[:SHA_PREFIX], model.take_invokes())

    def _escalate(self, pipe: RoutePipeline, group: list[Job], requests: list[Request], outcome: Outcome,
                  models: WorkerModels) -> Outcome:
        """The confidence cascade (cascade.py): `to_model` reruns the low-confidence requests on the
        heavier model; `to_topic` and `to_v2` park them (their reply becomes None) until the far
        tier answers."""
        if pipe.escalate_to is not None:
            return self._cascade.run_local(pipe, pipe.escalate_to, requests, outcome,
                                           models[pipe.escalate_to.route.model], self._cache)
        if self._far_v2 is not None and pipe.route.escalate.to_v2 is not None:
            self._far_v2.hand_off(self._cascade, pipe, group, outcome.replies)
            return outcome
        transport = self._replier.transport
        if self._remote is not None and transport is not None and pipe.route.escalate.to_topic is not None:
            self._remote.hand_off(self._cascade, pipe, group, outcome.replies, transport.publish)
        return outcome

    def _run_pipeline(self, model: Runner, pipe: RoutePipeline, group: list[Job], requests: list[Request],
                      stage_models: list[Runner]) -> Outcome:
        try:
            return request_path.handle_batch(pipe, requests, model, self._cache, self._clock,
                                             self._reuse.get(pipe.route.name),
                                             self._admission.batch_seconds(pipe.route.name, len(group)), stage_models)
        except Exception:  # a model or cache bug: isolate the request that causes it
            if len(group) == 1:
                return Outcome([self._internal(group[0], sys.exc_info()[1])])
            outcomes = [self._run_pipeline(model, pipe, [job], [request], stage_models)
                        for job, request in zip(group, requests)]
            return Outcome([o.replies[0] for o in outcomes], [e for o in outcomes for e in o.fresh])

    def _internal(self, job: Job, exc: Optional[BaseException]) -> dict:
        """The `internal` reply for a request whose processing raised (logged, throttled)."""
        route = job.pipe.route.name
        self._replier.log.warning(f"internal:{route}", "internal error on %r", job.inbound.topic, exc_info=True)
        reply = error(job.pipe, job.inbound, INTERNAL, f"{type(exc).__name__}: {exc}")
        return reply if job.item is None else {**reply, **job.item.fields}
