"""Intake, on paho's network thread: route, rate, admit and queue a request, or answer it at once.

O(1) apart from the topic match (remembered per topic): no decoding, no I/O. A request
that the rate or admission refuses is answered `rate_limited`, `overloaded` or `expired`
right away, its id read by a prefix scan, so nothing is dropped silently. One whose v5
message expiry has already run out when it is read is answered `expired` too, and counted
as `expired_on_arrival`: MQTT would let us ack it without a reply (the broker would have
discarded it), but the house promises one reply per request, and a client that gave up
loses nothing by hearing it.

The transport hands over the messages of one read burst at once (`on_burst`). What the
burst admits goes to the worker pool as `Job`s (jobs.py) in one hand-off
(`WorkerPool.submit_many`: one lock, one wake-up), the one hand-off to the worker side
(batches.py); the burst's counters and shed replies are recorded in the stats once.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Callable, Optional, Sequence

from daemon import topics
from daemon.config.schema import COALESCE_LATEST
from daemon.errors import EXPIRED, RATE_LIMITED
from daemon.obs.stats import Stats
from daemon.pipeline.route_pipeline import RoutePipeline
from daemon.serve.admission import Admission, Refusal
from daemon.serve.cascade import RemoteCascade
from daemon.serve.ha_devices import DiscoveredDevices
from daemon.serve.jobs import Job
from daemon.serve.rate import DeviceRate
from daemon.serve.stream_intake import StreamIntake
from daemon.serve.streams import Streams
from daemon.serve.replies import Replier, Tally, error
from daemon.transport.inbound import Inbound

logger = logging.getLogger(__name__)

RECEIVED = "received"
# The counter of requests whose deadline had passed when they were read.
EXPIRED_ON_ARRIVAL = "expired_on_arrival"
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
    """paho thread: a read burst -> queued jobs, handed on at once, or each one's reply at once."""

    def __init__(self, routes: RouteTable, rate: DeviceRate, admission: Admission,
                 submit_many: Callable[[Sequence[Job]], bool], replier: Replier, stats: Stats,
                 remote: Optional[RemoteCascade] = None, clock: Callable[[], float] = time.monotonic,
                 devices: Optional[DiscoveredDevices] = None,
                 control: Optional[Callable[[str, bytes], bool]] = None, streams: Optional[StreamIntake] = None):
        """`submit_many` queues a burst's jobs for the workers (False while they stop); `remote` is
        the far-tier cascade, whose answers arrive here too; `devices` learns each request's device
        (Home Assistant discovery, ha_devices.py); `control` takes the fleet's documents and commands
        (True when a message was one: it is acked, never routed); `streams`: the stream routes'
        windows (stream_intake.py)."""
        self._routes = routes
        self._rate = rate
        self._admission = admission
        self._submit_many = submit_many
        self._replier = replier
        self._stats = stats
        self._remote = remote
        self._clock = clock
        self._devices = devices
        self._control = control
        self._streams = streams or StreamIntake(admission, replier, Streams(stats))

    def on_burst(self, inbounds: Sequence[Inbound]) -> None:
        """The messages of one read burst, in order: each routed, rated and admitted, or answered at
        once; then the admitted ones go to the workers together (one lock, one wake-up) and the burst's
        counters and shed replies are recorded once. One that raises does not cost the others."""
        jobs: list[Job] = []
        tally = Tally()
        now = self._clock()  # one read: the burst's requests arrived together
        received = 0
        for inbound in inbounds:
            try:
                if self._remote is not None and inbound.topic == self._remote.response_topic:
                    self._far_answer(inbound)
                    continue
                if self._control is not None and self._control(inbound.topic, inbound.payload):
                    self._replier.ack(inbound)
                    continue
                received += 1
                self._admit(inbound, now, tally, jobs)
            except Exception:  # paho's loop thread must survive anything a message does
                logger.exception("failed to hand on a message from %r", inbound.topic)
        if jobs and not self._submit_many(jobs):
            for job in jobs:  # stopping: leave them unacked for redelivery
                self._admission.release(job.ticket)
                self._rate.withdraw(job.inbound.topic, job.seq)
        if received:
            self._stats.incr(RECEIVED, received)
        self._replier.record(tally)

    def on_message(self, inbound: Inbound) -> None:
        """One message: a burst of one."""
        self.on_burst((inbound,))

    def _far_answer(self, inbound: Inbound) -> None:
        if not self._remote.on_response(inbound):  # a far tier's answer to an escalation
            self._stats.incr("escalations_late")  # after its timeout (or from an earlier run): dropped
        self._replier.ack(inbound)

    def _admit(self, inbound: Inbound, now: float, tally: Tally, jobs: list[Job]) -> None:
        """The request's job into `jobs` when admitted; else it is answered (or, unroutable, acked).
        A stream route's message adds the jobs of the windows it completes (stream_intake.py)."""
        found = self._routes.find(inbound.topic)
        if found is None:
            # Only our own filters are subscribed, so this is a broker-side overlap; ack it.
            self._stats.incr("unroutable")
            self._replier.log.warning("unroutable", "no route matches topic %r", inbound.topic)
            self._replier.ack(inbound)
            return
        pipe, reply_topic = found
        route = pipe.route
        if self._devices is not None and inbound.response_topic is None:  # a v5 request's reply goes elsewhere
            self._devices.seen(route, inbound.topic, reply_topic, now)
        # Samples for a window, expired or not, are the stream's. Over HTTP a caller waits for an answer
        # to each payload: there it is a whole window, served as a request is.
        if route.input.stream is not None and not inbound.from_http:
            self._streams.take(pipe, inbound, reply_topic, now, tally, jobs)
            return
        deadline = inbound.deadline
        if deadline is not None and now >= deadline:
            self._expired_on_arrival(pipe, inbound, reply_topic, now - deadline, tally)
            return
        if route.min_interval_ms and self._rate.too_soon(inbound.topic, route.min_interval_ms, now):
            self._shed(pipe, inbound, reply_topic, Refusal(
                RATE_LIMITED, f"this device sent again within routes[].min_interval_ms ({route.min_interval_ms:g})"),
                tally)
            return
        verdict = self._admission.admit(route.name, len(inbound.payload), deadline, inbound.qos > 0)
        if isinstance(verdict, Refusal):
            self._shed(pipe, inbound, reply_topic, verdict, tally)
            return
        coalesce = route.coalesce == COALESCE_LATEST
        seq = self._rate.admitted(inbound.topic, now, coalesce) if coalesce or route.min_interval_ms else 0
        jobs.append(Job(pipe, inbound, reply_topic, verdict, seq))

    def _expired_on_arrival(self, pipe: RoutePipeline, inbound: Inbound, reply_topic: str, late_s: float,
                            tally: Tally) -> None:
        """Its v5 message expiry ran out before it was read (it waited in the socket or a burst): answered
        `expired` and counted, not acked silently, so every request still gets its one reply."""
        self._stats.incr(EXPIRED_ON_ARRIVAL)
        self._shed(pipe, inbound, reply_topic, Refusal(
            EXPIRED, f"the request's message expiry passed {late_s * 1000.0:.0f} ms before it was read"), tally)

    def _shed(self, pipe: RoutePipeline, inbound: Inbound, reply_topic: str, refusal: Refusal, tally: Tally) -> None:
        self._replier.send(inbound, reply_topic, error(pipe, inbound, refusal.code, refusal.message), tally)
