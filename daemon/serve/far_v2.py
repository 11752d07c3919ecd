"""`escalate.to_v2`: the cascade's far tier on an Open Inference Protocol (KServe v2) server.

After the local pipeline, on the worker, the low-confidence requests (cascade.Cascade.select,
within `max_rate_per_s`) are decoded and preprocessed with the far model's steps
(`escalate.preprocess`), parked with their local answer and a deadline (parking.py), and
queued; their reply becomes None (sent later). The worker goes on: it never waits on the network.

Each route's `concurrency` sender threads, one kept-alive connection each
(daemon/transport/v2_client.py), take up to `batch` queued rows (the rows escalated together)
and send them in one infer call along the batch dimension. The far scores, labelled with the
route's labels, replace the local answer: `"tier": "remote"`. Any failure (refused, timed
out, an HTTP error, a response that is not N rows of as many scores as the route has labels)
answers each of the call's requests with its local answer and `"escalation": "error"`; a
breaker (breaker.py) stops calling a server that keeps failing, and then escalated requests get
that answer at once. Past the deadline the local answer goes out (`"escalation": "timeout"`)
and a late far answer is dropped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from daemon.config.escalate_v2 import V2TierConfig
from daemon.pipeline import postprocess
from daemon.pipeline.route_pipeline import RoutePipeline
from daemon.serve.breaker import Breaker
from daemon.serve.cascade import FAR_ERROR, TIER_REMOTE, Cascade
from daemon.serve.parking import Parked, Parking, Send
from daemon.transport.inbound import Inbound
from daemon.transport.v2_client import V2CallError, V2Client

logger = logging.getLogger(__name__)

MIN_CALL_TIMEOUT_S = 0.001
STOP_JOIN_S = 5.0


@dataclass
class _Row:
    key: bytes
    x: np.ndarray  # the far model's input row, real values
    pipe: RoutePipeline  # labels and top_k of the route as it was when the row was escalated
    deadline: float


class _Senders:
    """One route's far tier: its queue, its sender threads (one V2Client each) and its breaker."""

    def __init__(self, route: str, tier: V2TierConfig, parking: Parking, clock: Callable[[], float]):
        self.tier = tier
        self.breaker = Breaker(f"{tier.url} (model {tier.model!r}, route {route!r})", tier.breaker_failures,
                               tier.breaker_open_s, clock)
        self._route = route
        self._parking = parking
        self._clock = clock
        self._queue: deque[_Row] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._threads = [threading.Thread(target=self._loop, name=f"to_v2-{route}-{i}", daemon=True)
                         for i in range(tier.concurrency)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def put(self, rows: Sequence[_Row]) -> None:
        with self._cond:
            self._queue.extend(rows)
            self._cond.notify(len(rows))

    def _take(self) -> Optional[list[_Row]]:
        """Up to `batch` rows still parked (expired ones are skipped); None once stopping."""
        with self._cond:
            while True:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return None
                rows = []
                while self._queue and len(rows) < self.tier.batch:
                    row = self._queue.popleft()
                    if self._parking.deadline(row.key) is not None:
                        rows.append(row)
                if rows:
                    return rows

    def _loop(self) -> None:
        client = V2Client(self.tier)
        try:
            while (rows := self._take()) is not None:
                self._call(client, rows)
        finally:
            client.close()

    def _call(self, client: V2Client, rows: list[_Row]) -> None:
        if not self.breaker.allow():
            self._fall_back(rows)
            return
        timeout_s = max(MIN_CALL_TIMEOUT_S, min(row.deadline for row in rows) - self._clock())
        try:
            scores, version = client.infer(np.stack([row.x for row in rows]), timeout_s)
            for row in rows:
                _check_width(row.pipe, scores.shape[1])
        except V2CallError as exc:
            self.breaker.failed(str(exc))
            logger.debug("to_v2 call for route %r failed: %s", self._route, exc)
            self._fall_back(rows)
            return
        self.breaker.succeeded()
        for row, row_scores in zip(rows, scores):
            self._parking.answer(row.key, lambda parked, r=row, s=row_scores: self._far_reply(parked, r, s, version))

    def _fall_back(self, rows: Sequence[_Row]) -> None:
        for row in rows:
            self._parking.answer(row.key, lambda parked: self._parking.fallback(parked, FAR_ERROR))

    def _far_reply(self, parked: Parked, row: _Row, scores: np.ndarray, version: Optional[str]) -> dict:
        route = row.pipe.route
        return {**parked.local, "model": self.tier.model, "model_sha256": None, "model_version": version,
                **postprocess.fields(route, row.pipe.label, None, scores), "cached": False,
                "tier": TIER_REMOTE, "latency_ms": self._parking.since_arrival(parked.inbound)}

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._queue.clear()  # their requests are still parked: Parking.stop answers them
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(STOP_JOIN_S)


def _check_width(pipe: RoutePipeline, width: int) -> None:
    expected = pipe.outputs.offsets[-1] if pipe.outputs is not None else len(pipe.labels)
    if expected and width != expected:
        raise V2CallError(f"{width} scores per row, but route {pipe.route.name!r}'s model has {expected} "
                          "(the tiers must share the labels)")


class V2Cascade(Parking):
    """The `to_v2` routes' far tiers, sharing one parking (and its expiry thread)."""

    def __init__(self, pipes: Sequence[RoutePipeline], send: Send, clock: Callable[[], float] = time.monotonic):
        super().__init__(send, clock, name="to_v2-expiry")
        self._senders = {p.route.name: _Senders(p.route.name, p.route.escalate.to_v2, self, clock)
                         for p in pipes if p.route.escalate is not None and p.route.escalate.to_v2 is not None}

    def start(self) -> None:
        super().start()
        for senders in self._senders.values():
            senders.start()

    def stop(self) -> None:
        super().stop()  # every request still parked gets its local answer now; a call in flight is late
        for senders in self._senders.values():
            senders.stop()

    def snapshot(self) -> dict:
        """For the stats' `to_v2`: per route, whether its breaker is open and how many times it
        opened; `parked` and `late` (far answers after their request's deadline) for all."""
        routes = {route: {"breaker_open": s.breaker.is_open, "breaker_episodes": s.breaker.episodes}
                  for route, s in self._senders.items()}
        return {"routes": routes, "parked": self.pending, "late": self.late}

    def hand_off(self, cascade: Cascade, pipe: RoutePipeline, jobs: Sequence, replies: list) -> list:
        """After the local pipeline (worker thread): park and queue the low-confidence requests
        (their reply becomes None: sent later), label the rest. `jobs` carry `.inbound` and
        `.reply_topic`."""
        senders = self._senders.get(pipe.route.name)
        chosen = cascade.select(pipe, replies)
        if not chosen or senders is None:
            return replies
        if senders.breaker.refusing():
            for i in chosen:  # a failing server: no call, the local answer at once
                self._at_once(replies[i], jobs[i].inbound)
            return replies
        esc = pipe.route.escalate
        x, failed = pipe.far_rows([jobs[i].inbound.payload for i in chosen])
        queued = []
        for n, i in enumerate(chosen):
            if n in failed:
                self._at_once(replies[i], jobs[i].inbound)
                continue
            job = jobs[i]
            key = self.park(job.inbound, job.reply_topic, replies[i], esc.far_timeout_s)
            queued.append(_Row(key, x[n], pipe, job.inbound.received_at + esc.far_timeout_s))
            replies[i] = None
        senders.put(queued)
        return replies

    def _at_once(self, reply: dict, inbound: Inbound) -> None:
        """A local answer that falls back without a call, timed to now (after the far rows' decoding)."""
        reply["escalation"] = FAR_ERROR
        reply["latency_ms"] = self.since_arrival(inbound)

