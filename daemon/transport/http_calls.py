"""An HTTP request's way through serving and back: Inbounds in, the replies to the waiting handler.

An HTTP request becomes one `Inbound` per row (a v2 tensor of N rows is N requests), handed to
serve's intake in one call, the same `on_burst` the MQTT link calls: the same rate check,
admission, batching, cache and workers. Its replies come back the way every reply goes, through
serve's Replier to its transport's `reply(topic, payload, inbound)`. With the listener on, that
transport is a `Switchboard`: requests that came over HTTP carry a negative `mid` (an MQTT
packet id is 0..65535, so no MQTT message can pose as one) and a reply topic in the reserved
`$http/<n>` namespace, for the logs. The switchboard hands those replies to `Calls`, which wakes
the waiting handler; every other reply, ack and publish goes to the MQTT link untouched. With the
listener off the link is attached directly, so MQTT pays nothing; with it on, one comparison
per reply.
"""

from __future__ import annotations

import itertools
import threading
import time
from contextlib import AbstractContextManager
from typing import Callable, Optional, Sequence

from daemon.transport.inbound import Inbound

HTTP_PREFIX = "$http/"  # reply topics of HTTP requests: never published (a `$` topic is the broker's)
# How an error reply's bytes read (serve/replies.py encodes `{"id", "route", "error": {...}}` with
# orjson): inside a JSON string a quote is escaped, so no label or id can contain this.
ERROR_MARK = b',"error":{'


class _Call:
    """One HTTP request's rows: their replies, and an event set once all are in."""

    __slots__ = ("replies", "_left", "_lock", "done")

    def __init__(self, n: int):
        self.replies: list[Optional[bytes]] = [None] * n
        self._left = n
        self._lock = threading.Lock()
        self.done = threading.Event()

    def put(self, index: int, payload: bytes) -> None:
        """One row's reply; the call is done once all are in, or at the first error (the request
        as a whole is answered with it, so waiting for the other rows would only delay that)."""
        with self._lock:
            if self.replies[index] is None:
                self.replies[index] = payload
                self._left -= 1
                if self._left == 0 or ERROR_MARK in payload:
                    self.done.set()


class Calls:
    """HTTP requests waiting for their replies, by number (-mid of their Inbounds).

    Called from the listener's handler threads (`serve`) and from whatever thread sends a reply
    (a worker, intake on a shed, the cascade): the dict's single operations are atomic, and each
    entry is taken once (`pop`), so a reply and a timeout cannot both claim it."""

    def __init__(self, on_burst: Callable[[Sequence[Inbound]], None], clock: Callable[[], float] = time.monotonic):
        self._on_burst = on_burst
        self._clock = clock
        self._numbers = itertools.count(1)
        self._pending: dict[int, tuple[_Call, int, Inbound]] = {}
        self.late = 0  # replies that came after their request's timeout (dropped)

    def serve(self, topic: str, payloads: Sequence[bytes], received_at: float, timeout_s: float) -> Optional[list]:
        """Hand the rows to intake as requests on `topic` and wait for every reply (the payloads, in
        order), or None once `timeout_s` from `received_at` has passed (504: the rows still in
        flight are answered to nobody). The timeout is each request's deadline too: admission
        answers `expired` at once what it predicts would miss it."""
        call = _Call(len(payloads))
        inbounds = []
        for i, payload in enumerate(payloads):
            n = next(self._numbers)  # itertools.count: atomic under the GIL
            inbound = Inbound(topic, payload, 0, -n, received_at, f"{HTTP_PREFIX}{n}", None, timeout_s)
            self._pending[n] = (call, i, inbound)
            inbounds.append(inbound)
        try:
            self._on_burst(inbounds)
            done = call.done.wait(max(0.0, received_at + timeout_s - self._clock()))
        finally:
            for inbound in inbounds:
                self._pending.pop(-inbound.mid, None)
        return call.replies if done else None  # at an early error some rows may be None

    def deliver(self, inbound: Inbound, payload: bytes) -> None:
        """A reply to an HTTP request, from whichever thread made it."""
        entry = self._pending.pop(-inbound.mid, None)
        if entry is None or entry[2] is not inbound:
            self.late += 1
            return
        call, index, _ = entry
        call.put(index, payload)

    @property
    def waiting(self) -> int:
        return len(self._pending)


class Switchboard:
    """The Replier's transport while the listener runs: HTTP requests' replies to `Calls`, the rest
    to the MQTT link (serve/replies.py's `Transport`)."""

    def __init__(self, link: object, calls: Calls):
        self._link = link
        self._calls = calls

    def reply(self, topic: str, payload: bytes, inbound: Inbound) -> None:
        if inbound.from_http:
            self._calls.deliver(inbound, payload)
        else:
            self._link.reply(topic, payload, inbound)

    def ack(self, inbound: Inbound) -> None:
        if inbound.mid >= 0:  # an HTTP request has nothing to acknowledge: its reply was its answer
            self._link.ack(inbound)

    def publish(self, topic: str, payload: bytes, retain: bool = False, correlation_data: Optional[bytes] = None,
                **options: object) -> object:
        return self._link.publish(topic, payload, retain, correlation_data, **options)

    def batch(self) -> AbstractContextManager:
        return self._link.batch()

    @property
    def link(self) -> object:
        return self._link
