"""Replies on their way out: every reply is encoded here, published, tallied, and its request
acked once the reply is safe at the broker (daemon/transport/mqtt.py, `MqttLink.reply`).

Used by intake (a shed request's one reply), by the worker side (a batch's replies) and by
the far-tier cascade (an escalated request's answer, or its local fallback).
"""

from __future__ import annotations

import logging
from collections import Counter
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Optional, Protocol

from daemon.obs.drift import DriftMonitor
from daemon.obs.model_watch import ModelWatch
from daemon.obs.stats import RESULT, Stats
from daemon.obs.throttled_log import ThrottledLog
from daemon.pipeline import codecs
from daemon.pipeline.route_pipeline import RoutePipeline
from daemon.transport.inbound import Inbound

logger = logging.getLogger(__name__)


class Transport(Protocol):
    def publish(self, topic: str, payload: bytes, retain: bool = False,
                correlation_data: Optional[bytes] = None) -> object: ...
    def ack(self, inbound: Inbound) -> None: ...
    def reply(self, topic: str, payload: bytes, inbound: Inbound) -> None: ...
    def batch(self) -> AbstractContextManager: ...


@dataclass
class Tally:
    """What a batch's replies add to the stats, recorded under one lock at the end."""

    counts: Counter = field(default_factory=Counter)
    latencies_ms: list = field(default_factory=list)
    outcomes: Counter = field(default_factory=Counter)
    answers: list = field(default_factory=list)  # (route, top-1 index or None, score) for drift
    watched: list = field(default_factory=list)  # (model sha256 prefix, route, index, score): the fleet canary


def error(pipe: RoutePipeline, inbound: Inbound, code: str, message: str) -> dict:
    """An error reply to a request that was not decoded (shed, superseded, or failed)."""
    return pipe.error_for(inbound.payload, code, message)


class Replier:
    """Publishes replies and acks requests through the transport, once it is attached."""

    def __init__(self, stats: Stats, drift: Optional[DriftMonitor] = None, watch: Optional[ModelWatch] = None):
        """`drift`: watches the answers of classify and anomaly routes (daemon/obs/drift.py);
        `watch`: each release's answers, for the fleet canary (daemon/obs/model_watch.py)."""
        self._stats = stats
        self._drift = drift
        self._watch = watch
        self._transport: Optional[Transport] = None
        self.log = ThrottledLog(logger)  # per-request problems, at most one line per key and interval

    def attach(self, transport: Transport) -> None:
        self._transport = transport

    @property
    def watches_drift(self) -> bool:
        return self._drift is not None

    @property
    def transport(self) -> Optional[Transport]:
        return self._transport

    def batch(self) -> AbstractContextManager:
        """Around a batch of replies: paho's loop is woken once for all of them."""
        return self._transport.batch() if self._transport is not None else nullcontext()

    def send(self, inbound: Inbound, reply_topic: str, reply: dict, tally: Tally) -> None:
        """Publish one reply (on the v5 ResponseTopic when the request has one) and count it."""
        error = reply.get("error")
        tally.outcomes[(reply.get("route") or "", error["code"] if error else RESULT)] += 1
        if error:
            self.log.warning(error["code"], "request on %r answered %s: %s", inbound.topic,
                             error["code"], error["message"])
        else:
            tally.counts["cache_hits" if reply["cached"] else "inferences"] += 1
            if "tier" in reply:  # a cascade route (cascade.py): who answered, and any fallback
                tally.counts[f"tier_{reply['tier']}"] += 1
                if "escalation" in reply:
                    tally.counts[f"escalation_{reply['escalation']}"] += 1
            tally.latencies_ms.append(reply["latency_ms"])
            if self._drift is not None:
                drift_answer(reply, tally.answers)
            if self._watch is not None:
                watched_answer(reply, tally.watched)
        topic = inbound.response_topic or reply_topic
        if self._transport is not None:
            self._transport.reply(topic, codecs.encode(reply), inbound)  # acks it once the reply is safe

    def send_one(self, inbound: Inbound, reply_topic: str, reply: dict) -> None:
        """A reply made off a batch: a shed request, an escalation's answer or its local fallback."""
        tally = Tally()
        self.send(inbound, reply_topic, reply, tally)
        self.record(tally)

    def record(self, tally: Tally) -> None:
        self._stats.record(tally.counts, tally.latencies_ms, tally.outcomes)
        if tally.answers:
            self._drift.observe(tally.answers)
        if tally.watched:
            self._watch.observe(tally.watched)

    def ack(self, inbound: Inbound) -> None:
        """A message that gets no reply (not a request): acked at once."""
        if self._transport is not None:
            self._transport.ack(inbound)


def drift_answer(reply: dict, answers: list) -> None:
    """A result's part in its route's drift: a classifier's top-1 index and score, or an anomaly
    score; a detector's or a `values` reply has none (daemon/obs/drift.py says why)."""
    if "index" in reply:
        answers.append((reply["route"], reply["index"], reply["score"]))
    elif "anomaly_score" in reply:
        answers.append((reply["route"], None, reply["anomaly_score"]))


def watched_answer(reply: dict, answers: list) -> None:
    """A result's part in its release's canary window: as `drift_answer`, with the release that
    made it, and the top-1 answer by its label; a detector's or a `values` reply counts with no
    score to compare."""
    if reply.get("tier") == "remote":  # a far tier answered: not this release's answer
        return
    sha = reply.get("model_sha256", "")
    if "index" in reply:  # by label: a release with the same model and permuted labels answers differently
        answers.append((sha, reply["route"], reply.get("label", reply["index"]), reply["score"]))
    elif "anomaly_score" in reply:
        answers.append((sha, reply["route"], None, reply["anomaly_score"]))
    else:
        answers.append((sha, reply["route"], None, float("nan")))
