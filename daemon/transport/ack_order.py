"""PUBACKs in the order their PUBLISHes arrived, as MQTT requires of a client.

MQTT 3.1.1 and v5 (section 4.6, Message ordering): a client MUST send PUBACK packets in the
order in which the corresponding QoS 1 PUBLISH packets were received. The daemon acks a
request only once its reply is safe at the broker, and replies finish out of order (two
workers, batches, routes of different cost, errors answered at intake). mosquitto takes
PUBACKs in any order; rumqttd 0.20 does not: an out-of-order PUBACK is logged as "out of
order ack" and its outgoing window (100 messages) stops draining, so a 5,000-request burst
stalled after 296-956 answers with nothing left in the daemon.

So an ack is held until every request received before it on this connection can be acked,
then they go out together, in order, under one lock (two workers never interleave theirs).
Each connection starts a fresh order: a request from an earlier connection is never acked on
this one, where its packet id may name another message; the broker redelivers it instead
(a duplicate reply at worst, which at-least-once allows).

It also knows which waiting requests are answered (their reply handed to the link): when
every one of at least a window's worth is, nothing here can move them but the broker
(safe_ack.py).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Callable

from daemon.transport.inbound import Inbound


class AckOrder:
    """Requests (QoS > 0) in arrival order; `send` gets the ones whose turn has come, in order."""

    def __init__(self, send: Callable[[list[Inbound]], None]):
        """`send` is called with the lock held, so the acks reach the wire in order."""
        self._send = send
        self._lock = threading.Lock()
        self._queue: deque[Inbound] = deque()
        self._pending: set[int] = set()  # id() of each queued request
        self._ready: set[int] = set()  # id() of queued requests that may be acked
        self._answered: set[int] = set()  # id() of queued requests whose reply awaits its PUBACK
        self.stale = 0  # acks of an earlier connection's requests, not sent

    def arrived(self, inbound: Inbound) -> None:
        """The network thread, per message, in the order read (before anything can ack it)."""
        if inbound.qos > 0:
            with self._lock:
                self._queue.append(inbound)
                self._pending.add(id(inbound))

    def ack(self, inbound: Inbound) -> None:
        """`inbound` may be acked: send it and every later one already ackable, once its turn comes."""
        if inbound.qos == 0:
            return
        key = id(inbound)
        with self._lock:
            if key not in self._pending:
                self.stale += 1
                return
            self._ready.add(key)
            self._answered.discard(key)
            queue, turn = self._queue, []
            while queue and id(queue[0]) in self._ready:
                head = queue.popleft()
                self._ready.discard(id(head))
                self._pending.discard(id(head))
                turn.append(head)
            if turn:
                self._send(turn)

    def answered(self, inbound: Inbound) -> None:
        """`inbound`'s reply is handed to the link (call it before the publish wakes the network
        thread, so the thread's next check sees it); a no-op once it may be acked."""
        key = id(inbound)
        with self._lock:
            if key in self._pending and key not in self._ready:
                self._answered.add(key)

    def all_answered(self, at_least: int) -> bool:
        """At least `at_least` requests wait, and each is answered or ackable: none is being worked on."""
        with self._lock:
            waiting = len(self._queue)
            return waiting >= at_least and len(self._answered) + len(self._ready) >= waiting

    def answered_keys(self) -> set[int]:
        """id() of the waiting requests whose replies await their PUBACK."""
        with self._lock:
            return set(self._answered)

    def new_connection(self) -> None:
        """A new connection (after its CONNACK, before its first PUBLISH): the old order is void."""
        with self._lock:
            self._queue.clear()
            self._pending.clear()
            self._ready.clear()
            self._answered.clear()

    @property
    def waiting(self) -> int:
        """Requests received and not acked yet on this connection."""
        return len(self._queue)
