"""The confidence cascade (`escalate:` on a route): low-confidence results go to a heavier tier.

`to_model`: on the worker, right after the route's pipeline, the requests whose result is
below the threshold (`EscalateConfig.wants`) run again through the heavier model's pipeline
(the same route, another model); its result replaces the local one and says
`"tier": "local-large"`. Every other result of such a route says `"tier": "local"`. The
heavier model runs only on the escalated rows, in one batch, so the cascade costs the fast
model on everything plus the large model on the escalated share (docs/performance.md).

A token bucket per route caps escalations at `max_rate_per_s`: past it the local answer is
sent as it is, with `"escalation": "rate_limited"`, so a flood of hard inputs cannot make
the node pay the large model on all of them. The stats count those (`escalation_rate_limited`),
and the log says it once per route and interval (the replier's throttled log).

`to_topic` (`RemoteCascade`): the original request bytes go to the rendered `to_topic` as an
MQTT v5 request, with our own ResponseTopic (`edge-inferd/<client_id>/escalations`, which
intake subscribes to) and a fresh CorrelationData. The far tier (another edge-inferd
answers on ResponseTopic with CorrelationData) replies with a result of the same contract,
published on the request's reply topic with `"tier": "remote"`. The request meanwhile holds
no worker: it is parked with a deadline (parking.py); past `timeout_ms` the local answer goes
out with `"escalation": "timeout"`, and a far answer after that is dropped. `to_v2` (far_v2.py)
parks the same way. The request is
acked once its one reply is safe at the broker (mqtt.MqttLink.reply), whichever it was.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Callable, Optional, Sequence

from daemon import topics
from daemon.pipeline import request_path
from daemon.config.schema import RouteConfig
from daemon.config.escalate import EscalateConfig
from daemon.obs.throttled_log import ThrottledLog
from daemon.serve.parking import MS, Parked, Parking, Send
from daemon.transport.inbound import Inbound
from daemon.pipeline.route_pipeline import Outcome, Request, RoutePipeline, Runner, ScoreCache

logger = logging.getLogger(__name__)

TIER_LOCAL = "local"
TIER_LARGE = "local-large"
TIER_REMOTE = "remote"
RATE_LIMITED = "rate_limited"
FAR_ERROR = "error"  # the far tier answered with an error (or garbage): the local answer stands
ERROR_EXCERPT = 200


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

    def __init__(self, clock: Callable[[], float], log: Optional[ThrottledLog] = None):
        """`log`: where a rate-limited escalation is said, at most once per route and interval
        (the replier's, with the other per-request problems)."""
        self._clock = clock
        self._buckets: dict[str, TokenBucket] = {}
        self._lock = threading.Lock()
        self._log = log or ThrottledLog(logger)

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
                    self._rate_limited(pipe.route.name, esc.max_rate_per_s)
        return chosen

    def _rate_limited(self, route: str, rate: float) -> None:
        # A burst past the cap (20/s by default) is otherwise seen only in the replies and in the
        # stats' escalation_rate_limited count: say it in the log too, once per interval.
        self._log.warning(f"{RATE_LIMITED}:{route}", "route %r: more low-confidence results than "
                          "escalate.max_rate_per_s (%s/s); the rest get the local answer with "
                          "\"escalation\": \"rate_limited\"", route, rate)

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
        _leave_now(outcome.replies, requests, self._clock())
        outcome.fresh.extend(large.fresh)
        for stage, seconds in large.stages.items():
            outcome.stages[stage] = outcome.stages.get(stage, 0.0) + seconds  # the request's cost, both tiers
        return outcome


def _leave_now(replies: Sequence[dict], requests: Sequence[Request], now: float) -> None:
    """The batch's local answers (a `rate_limited` one among them) leave after the heavier model's
    run, not when the local one ended: their `latency_ms`, from arrival, says so."""
    for reply, request in zip(replies, requests):
        if "error" not in reply and reply.get("tier") == TIER_LOCAL:
            reply["latency_ms"] = round((now - request.received_at) * MS, 3)


def remote_topic(route: RouteConfig, topic: str) -> str:
    """`escalate.to_topic` rendered for a request topic, with the route filter's captures."""
    return topics.render(route.escalate.to_topic, topic, topics.match(route.subscribe, topic) or ())


class RemoteCascade(Parking):
    """`to_topic`: escalated requests wait here (parking.py), holding no worker, for the far
    tier's answer, keyed by the CorrelationData they were forwarded with."""

    def __init__(self, response_topic: str, send: Send, clock: Callable[[], float] = time.monotonic):
        super().__init__(send, clock)
        self.response_topic = response_topic

    def on_response(self, inbound: Inbound) -> bool:
        """The far tier's answer (paho thread): published in place of the local one if still parked
        (True); else dropped (False)."""
        return self.answer(inbound.correlation_data or b"", lambda parked: self._remote_reply(parked, inbound.payload))

    def _remote_reply(self, parked: Parked, payload: bytes) -> dict:
        try:
            far = json.loads(payload)
        except ValueError:
            far = None
        if not isinstance(far, dict) or "error" in far or "index" not in far:
            logger.warning("escalation answered %r: the local answer stands", payload[:ERROR_EXCERPT])
            return self.fallback(parked, FAR_ERROR)
        return {**far, "id": parked.local["id"], "route": parked.local["route"], "tier": TIER_REMOTE,
                "latency_ms": self.since_arrival(parked.inbound)}

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
