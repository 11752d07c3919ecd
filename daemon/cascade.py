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
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Optional, Sequence

from daemon import pipeline
from daemon.config_cascade import EscalateConfig
from daemon.pipeline import Outcome, Request, RoutePipeline, Runner, ScoreCache

logger = logging.getLogger(__name__)

TIER_LOCAL = "local"
TIER_LARGE = "local-large"
TIER_REMOTE = "remote"
RATE_LIMITED = "rate_limited"
TIMEOUT = "timeout"


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


def wants(esc: EscalateConfig, reply: dict) -> bool:
    """A result (not an error) whose confidence is below the route's threshold."""
    if "error" in reply:
        return False
    return esc.wants([entry["score"] for entry in reply["top_k"]])


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
            if wants(esc, reply):
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
            large = pipeline.handle_batch(large_pipe, [requests[i] for i in chosen], large_model, cache, self._clock)
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
