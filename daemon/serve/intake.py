"""Intake, on paho's network thread: route, rate, admit and queue a request, or answer it at once.

O(1) apart from the topic match (remembered per topic): no decoding, no I/O. A request
that the rate or admission refuses is answered `rate_limited`, `overloaded` or `expired`
right away, its id read by a prefix scan, so nothing is dropped silently. What is
admitted goes to the worker pool as a `Job` (jobs.py), the one hand-off to the worker
side (batches.py).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Callable, Optional, Sequence

from daemon import topics
from daemon.config.schema import COALESCE_LATEST
from daemon.errors import RATE_LIMITED
from daemon.obs.stats import Stats
from daemon.pipeline.route_pipeline import RoutePipeline
from daemon.serve.admission import Admission, Refusal
from daemon.serve.cascade import RemoteCascade
from daemon.serve.jobs import Job
from daemon.serve.rate import DeviceRate
from daemon.serve.replies import Replier, error
from daemon.transport.inbound import Inbound

logger = logging.getLogger(__name__)

# Request topics whose route and reply topic are remembered (devices seen recently).
ROUTE_MEMO_SIZE = 4096


class RouteTable:
    """The route of a request topic and its rendered reply topic, remembered per topic."""

    def __init__(self, pipes: Sequence[RoutePipeline]):
        self._pipes = tuple(pipes)
        self._memo: OrderedDict[str, tuple[RoutePipeline, str]] = OrderedDict()

    @property
    def filters(self) -> list[str]:
        return [p.route.subscribe for p in self._pipes]

    def replace(self, pipes: Sequence[RoutePipeline]) -> None:
        """New pipelines for the same routes (a reload): remembered pairs name the old ones."""
        self._pipes = tuple(pipes)
        self._memo = OrderedDict()

    def find(self, topic: str) -> Optional[tuple[RoutePipeline, str]]:
        found = self._memo.get(topic)
        if found is not None:
            return found
        for pipe in self._pipes:
            captures = topics.match(pipe.route.subscribe, topic)
            if captures is not None:
                found = (pipe, topics.render(pipe.route.publish, topic, captures))
                self._memo[topic] = found
                if len(self._memo) > ROUTE_MEMO_SIZE:
                    self._memo.popitem(last=False)
                return found
        return None


class Intake:
    """paho thread: a message -> a queued job, or its one reply at once."""

    def __init__(self, routes: RouteTable, rate: DeviceRate, admission: Admission, submit: Callable[[Job], bool],
                 replier: Replier, stats: Stats, remote: Optional[RemoteCascade] = None,
                 clock: Callable[[], float] = time.monotonic):
        """`submit` queues a job for the workers (False while they stop); `remote` is the far-tier
        cascade, whose answers arrive here too."""
        self._routes = routes
        self._rate = rate
        self._admission = admission
        self._submit = submit
        self._replier = replier
        self._stats = stats
        self._remote = remote
        self._clock = clock

    def on_burst(self, inbounds: Sequence[Inbound]) -> None:
        """The messages of one read burst, in order; one that raises does not cost the others."""
        for inbound in inbounds:
            try:
                self.on_message(inbound)
            except Exception:  # paho's loop thread must survive anything a message does
                logger.exception("failed to hand on a message from %r", inbound.topic)

    def on_message(self, inbound: Inbound) -> None:
        if self._remote is not None and inbound.topic == self._remote.response_topic:
            if not self._remote.on_response(inbound):  # a far tier's answer to an escalation
                self._stats.incr("escalations_late")  # after its timeout (or from an earlier run): dropped
            self._replier.ack(inbound)
            return
        self._stats.incr("received")
        found = self._routes.find(inbound.topic)
        if found is None:
            # Only our own filters are subscribed, so this is a broker-side overlap; ack it.
            self._stats.incr("unroutable")
            self._replier.log.warning("unroutable", "no route matches topic %r", inbound.topic)
            self._replier.ack(inbound)
            return
        pipe, reply_topic = found
        route = pipe.route
        if self._rate.too_soon(inbound.topic, route.min_interval_ms, self._clock()):
            self._shed(pipe, inbound, reply_topic, Refusal(
                RATE_LIMITED, f"this device sent again within routes[].min_interval_ms ({route.min_interval_ms:g})"))
            return
        verdict = self._admission.admit(route.name, len(inbound.payload), inbound.deadline)
        if isinstance(verdict, Refusal):
            self._shed(pipe, inbound, reply_topic, verdict)
            return
        coalesce = route.coalesce == COALESCE_LATEST
        seq = self._rate.admitted(inbound.topic, self._clock(), coalesce) if coalesce or route.min_interval_ms else 0
        if not self._submit(Job(pipe, inbound, reply_topic, verdict, seq)):
            self._admission.release(verdict)  # stopping: leave it unacked for redelivery
            self._rate.withdraw(inbound.topic, seq)

    def _shed(self, pipe: RoutePipeline, inbound: Inbound, reply_topic: str, refusal: Refusal) -> None:
        self._replier.send_one(inbound, reply_topic, error(pipe, inbound, refusal.code, refusal.message))
