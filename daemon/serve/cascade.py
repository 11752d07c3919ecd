"""The confidence cascade (`escalate:` on a route): low-confidence results go to a heavier tier.

`to_model`: on the worker, right after the route's pipeline, the requests whose result is
below the threshold (`EscalateConfig.wants`) run again through the heavier model's pipeline
(the same route, another model); its result replaces the local one and says
`"tier": "local-large"`. Every other result of such a route says `"tier": "local"`. The
heavier model runs only on the escalated rows, in one batch, so the cascade costs the fast
model on everything plus the large model on the escalated share (docs/performance.md).

A token bucket per route caps escalations at `max_rate_per_s`: past it the local answer is
sent as it is, with `"escalation": "rate_limited"`, so a flood of hard inputs cannot make
the node pay the large model on all of them.

`to_topic` (`RemoteCascade`): the original request bytes go to the rendered `to_topic` as an
MQTT v5 request, with our own ResponseTopic (`edge-inferd/<client_id>/escalations`, which
intake subscribes to) and a fresh CorrelationData. The far tier (another edge-inferd
answers on ResponseTopic with CorrelationData) replies with a result of the same contract,
published on the request's reply topic with `"tier": "remote"`. The request meanwhile holds
no worker: it waits in a dict with a deadline; past `timeout_ms` the local answer goes out
with `"escalation": "timeout"`, and a far answer after that is dropped. The request is
acked once its one reply is safe at the broker (mqtt.MqttLink.reply), whichever it was.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from daemon import topics
from daemon.pipeline import request_path
from daemon.config.schema import RouteConfig
from daemon.config.escalate import EscalateConfig
from daemon.transport.inbound import Inbound
from daemon.pipeline.route_pipeline import Outcome, Request, RoutePipeline, Runner, ScoreCache

logger = logging.getLogger(__name__)

TIER_LOCAL = "local"
TIER_LARGE = "local-large"
TIER_REMOTE = "remote"
RATE_LIMITED = "rate_limited"
TIMEOUT = "timeout"
FAR_ERROR = "error"  # the far tier answered with an error (or garbage): the local answer stands
CORRELATION_PREFIX_BYTES = 4
ERROR_EXCERPT = 200
STOP_JOIN_S = 5.0


class TokenBucket:
    """`rate` tokens per second, holding at most one second's worth (at least one token)."""

    def __init__(self, rate: float, clock: Callable[[], float]):
        self._rate = rate
        self._capacity = max(1.0, rate)
        self._tokens = self._capacity
        self._clock = clock
        self._last = clock()
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            now = self._clock()
            self._tokens = min(self._capacity, self._tokens + (now - self._last) * self._rate)
            self._last = now
            if self._tokens < 1.0:
                return False
            self._tokens -= 1.0
            return True


class Cascade:
    """Per-route rate buckets and the local (`to_model`) escalation; shared by the workers."""

    def __init__(self, clock: Callable[[], float]):
        self._clock = clock
        self._buckets: dict[str, TokenBucket] = {}
        self._lock = threading.Lock()

    def bucket(self, route: str, esc: EscalateConfig) -> TokenBucket:
        with self._lock:
            found = self._buckets.get(route)
            if found is None:
                found = self._buckets[route] = TokenBucket(esc.max_rate_per_s, self._clock)
            return found

    def select(self, pipe: RoutePipeline, replies: Sequence[dict]) -> list[int]:
        """Indices of the replies to escalate, within the rate; the others are labelled local
        (`"escalation": "rate_limited"` for those the cap kept back)."""
        esc = pipe.route.escalate
        chosen = []
        for i, reply in enumerate(replies):
            if "error" in reply:
                continue
            reply["tier"] = TIER_LOCAL
            if esc.wants([entry["score"] for entry in reply["top_k"]]):
                if self.bucket(pipe.route.name, esc).take():
                    chosen.append(i)
                else:
                    reply["escalation"] = RATE_LIMITED
        return chosen

    def run_local(self, pipe: RoutePipeline, large_pipe: RoutePipeline, requests: Sequence[Request],
                  outcome: Outcome, large_model: Runner, cache: Optional[ScoreCache]) -> Outcome:
        """`to_model`: the outcome with the escalated requests answered by the heavier model."""
        chosen = self.select(pipe, outcome.replies)
        if not chosen:
            return outcome
        try:
            large = request_path.handle_batch(large_pipe, [requests[i] for i in chosen], large_model, cache, self._clock)
        except Exception:  # the heavier model failing must not cost the request its local answer
            logger.warning("escalation to model %r failed; local answers kept", large_pipe.route.model,
                           exc_info=True)
            return outcome
        for i, reply in zip(chosen, large.replies):
            if "error" not in reply:
                reply["tier"] = TIER_LARGE
                outcome.replies[i] = reply
        outcome.fresh.extend(large.fresh)
        for stage, seconds in large.stages.items():
            outcome.stages[stage] = outcome.stages.get(stage, 0.0) + seconds  # the request's cost, both tiers
        return outcome


def remote_topic(route: RouteConfig, topic: str) -> str:
    """`escalate.to_topic` rendered for a request topic, with the route filter's captures."""
    return topics.render(route.escalate.to_topic, topic, topics.match(route.subscribe, topic) or ())


@dataclass
class _Pending:
    inbound: Inbound
    reply_topic: str
    local: dict
    deadline: float


Send = Callable[[Inbound, str, dict], None]  # replies.Replier.send_one: publish, then ack on PUBACK


class RemoteCascade:
    """`to_topic`: escalated requests wait here, holding no worker, for the far tier's answer.

    Each is parked under a fresh CorrelationData with its local answer and a deadline. Whoever
    takes it out of `_pending` first answers it, under the lock, so a request is answered once:
    the far tier's reply (`on_response`, paho thread: `"tier": "remote"`), or the expiry thread
    (`"escalation": "timeout"`: the local answer), or `stop` (the same). A far answer that finds
    nothing parked (late, or from an earlier run) is dropped and counted in `late`."""

    def __init__(self, response_topic: str, send: Send, clock: Callable[[], float] = time.monotonic):
        self.response_topic = response_topic
        self._send = send
        self._clock = clock
        self._pending: dict[bytes, _Pending] = {}
        self._heap: list[tuple[float, bytes]] = []
        self._cond = threading.Condition()
        self._prefix = os.urandom(CORRELATION_PREFIX_BYTES).hex()  # ids of an earlier run never match
        self._ids = itertools.count()
        self._stopping = False
        self._thread: Optional[threading.Thread] = None
        self.late = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._expire_loop, name="escalations", daemon=True)
        self._thread.start()

    def park(self, inbound: Inbound, reply_topic: str, local: dict, timeout_s: float) -> bytes:
        """Hold a request's local answer until the far tier answers or `timeout_s` has passed since
        the request arrived (its queueing and local inference count: the user waits for those too)."""
        corr = f"{self._prefix}-{next(self._ids)}".encode()
        deadline = inbound.received_at + timeout_s
        with self._cond:
            self._pending[corr] = _Pending(inbound, reply_topic, local, deadline)
            heapq.heappush(self._heap, (deadline, corr))
            self._cond.notify()
        return corr

    def on_response(self, inbound: Inbound) -> bool:
        """The far tier's answer (paho thread): published in place of the local one if still parked
        (True); else dropped (False)."""
        with self._cond:
            parked = self._pending.pop(inbound.correlation_data or b"", None)
            if parked is None:
                self.late += 1
                return False
        self._send(parked.inbound, parked.reply_topic, self._remote_reply(parked, inbound.payload))
        return True

    def _remote_reply(self, parked: _Pending, payload: bytes) -> dict:
        try:
            far = json.loads(payload)
        except ValueError:
            far = None
        if not isinstance(far, dict) or "error" in far or "index" not in far:
            logger.warning("escalation answered %r: the local answer stands", payload[:ERROR_EXCERPT])
            return {**parked.local, "escalation": FAR_ERROR}
        latency_ms = (self._clock() - parked.inbound.received_at) * 1000.0
        return {**far, "id": parked.local["id"], "route": parked.local["route"], "tier": TIER_REMOTE,
                "latency_ms": round(latency_ms, 3)}

    def expire_due(self) -> None:
        """Answer locally every request past its deadline (the expiry thread; tests call it too)."""
        due = []
        with self._cond:
            now = self._clock()
            while self._heap and (self._heap[0][0] <= now or self._heap[0][1] not in self._pending):
                _, corr = heapq.heappop(self._heap)
                parked = self._pending.pop(corr, None)
                if parked is not None:
                    due.append(parked)
        for parked in due:
            self._send(parked.inbound, parked.reply_topic, {**parked.local, "escalation": TIMEOUT})

    def _expire_loop(self) -> None:
        while True:
            self.expire_due()
            with self._cond:
                if self._stopping:
                    return
                wait = self._heap[0][0] - self._clock() if self._heap else None
                if wait is None or wait > 0:
                    self._cond.wait(wait)  # woken by `park` (an earlier deadline) or `stop`

    def stop(self) -> None:
        """Answer every parked request locally (`timeout`) and end the expiry thread."""
        with self._cond:
            self._stopping = True
            left, self._pending, self._heap = list(self._pending.values()), {}, []
            self._cond.notify()
        for parked in left:
            self._send(parked.inbound, parked.reply_topic, {**parked.local, "escalation": TIMEOUT})
        if self._thread is not None:
            self._thread.join(STOP_JOIN_S)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def hand_off(self, cascade: Cascade, pipe: RoutePipeline, jobs: Sequence, replies: list,
                 publish: Callable[..., object]) -> list:
        """After the local pipeline: park and forward the low-confidence requests (their reply
        becomes None: sent later), label the rest. `jobs` carry `.inbound` and `.reply_topic`."""
        esc = pipe.route.escalate
        for i in cascade.select(pipe, replies):
            job = jobs[i]
            corr = self.park(job.inbound, job.reply_topic, replies[i], esc.timeout_ms / 1000.0)
            publish(remote_topic(pipe.route, job.inbound.topic), job.inbound.payload, correlation_data=corr,
                    response_topic=self.response_topic)
            replies[i] = None
        return replies
