"""The native link's acks on the disk's word, once the broker holds its window to us full.

The daemon acks a request once its reply is safe: normally once the broker has the reply (its
PUBACK). rumqttd 0.20 writes at most 100 unacked QoS 1 PUBLISHes to a client, whatever the
client's ReceiveMaximum, and while those 100 are unacked it confirms none of that client's own
publishes (tools/dev/probe_rumqttd.py full_window). With a backlog at the broker the daemon
answers its 100, their replies wait for PUBACKs that wait for the acks: nothing moves again.

That state is recognised when at least `window` requests wait unacked on this connection
(ack_order.py), every one of them is answered (its reply handed to the link, or PUBACKed and
waiting for its turn), and no PUBACK has come for QUIET_S since it was first seen: nothing the
daemon does can free them; only the broker could, and a broker whose window to us is full does
not, and confirms nothing meanwhile. `window` is the smaller of our ReceiveMaximum and
`mqtt.outbox.broker_window` (100: rumqttd's). Then, on the network thread:

1. the replies still waiting for their PUBACK are written to the on-disk outbox (outbox.py) in
   one transaction, all or none;
2. each stays where it was in the publish window (same packet id, resent on a reconnect as
   before) but is now owned by its outbox row, which its PUBACK deletes; the outbox's flusher
   never hands those rows again in this process;
3. their requests are acked (in order, ack_order.py), and counted (`outbox.acks_after_outbox`).

So a request is acked only once its reply is PUBACKed or on disk. A crash after the ack and
before the PUBACK leaves the row, and the next run sends it again: a duplicate, never a loss.
While any waiting request is still being worked on the check is false; a broker that
confirms replies within a round trip (mosquitto) meets the rest of it often under a backlog
(100 answered, their PUBACKs a round trip away), which is why the quiet time: without it, a
gunpoint drain on mosquitto wrote replies to the outbox it never needed, 11% of the daemon's
CPU (py-spy). Without an outbox (`mqtt.outbox.max_mb: 0`), or with one too full for the lot,
the link waits as before.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from typing import Callable, Optional

from daemon.obs.throttled_log import ThrottledLog
from daemon.transport.ack_order import AckOrder
from daemon.transport.inbound import Inbound
from daemon.transport.native_window import PublishWindow
from daemon.transport.outbox import Outbox, OutboxFlusher
from daemon.transport.puback import AwaitingPuback

logger = logging.getLogger(__name__)
# How long the held state must last with no PUBACK heard before the disk is trusted instead: above
# a loopback or LAN round trip, and a delay a held broker pays once per window of 100, so it caps a
# backlog's drain there (gunpoint on rumqttd, benchmarks/bench_rumqttd.py: 3,077 req/s at 20 ms,
# 5,764 at 5 ms; a mosquitto backlog of 1,000 met it 0 times at either).
QUIET_S = 0.005


class SafeAck:
    """Finds the held-window state and acks its requests once their replies are on disk."""

    def __init__(self, window: int, order: AckOrder, lock: threading.Lock, publishes: PublishWindow,
                 awaiting: AwaitingPuback, outbox: Optional[Outbox], flusher: Optional[OutboxFlusher],
                 ack: Callable[[Inbound], None], quiet_s: float = QUIET_S,
                 clock: Callable[[], float] = time.monotonic):
        """`lock` guards `publishes` (the link's lock); `ack` acks one request (held for its turn)."""
        self.window = window
        self._order = order
        self._lock = lock
        self._publishes = publishes
        self._awaiting = awaiting
        self._outbox = outbox
        self._flusher = flusher
        self._ack = ack
        self._log = ThrottledLog(logger)
        self._quiet_s = quiet_s
        self._clock = clock
        self._since: Optional[float] = None  # when the held state was first seen with no PUBACK since
        self.acks = 0  # requests acked once their replies were on disk, not PUBACKed
        self.flushes = 0  # times the held window was relieved
        self._failed = False  # the last relief could not store its replies (disk error, outbox full)

    @property
    def can_relieve(self) -> bool:
        """Whether a held window can be relieved here: an outbox, and the last relief stored its rows."""
        return self._outbox is not None and self.window > 0 and not self._failed

    def heard(self) -> None:
        """A PUBACK came (the network thread): the broker is confirming, the window is not held."""
        self._since = None

    def due(self) -> Optional[float]:
        """When the next check may relieve a window (the network thread's wait ends then), or None."""
        return None if self._since is None else self._since + self._quiet_s

    def check(self) -> None:
        """The network thread, once per pass: relieve a held window (it alone takes PUBACKs, so
        nothing leaves the publish window meanwhile)."""
        if self._outbox is None or self.window <= 0 or not self._order.all_answered(self.window):
            self._since = None
            return
        now = self._clock()
        if self._since is None:
            self._since = now
        if now - self._since >= self._quiet_s:
            self._since = None
            self._relieve()

    def _relieve(self) -> None:
        keys = self._order.answered_keys()
        with self._lock:
            outs = self._publishes.owned(keys)
        if not outs:
            return  # answered, not yet in the window: its publish wakes the thread again
        try:
            rows = self._outbox.put_rows([(o.topic, o.payload, o.correlation_data) for o in outs])
        except (OSError, sqlite3.Error) as exc:
            self._failed = True
            self._log.warning("store", "outbox %s: cannot store %d replies of a held window (%s); their "
                              "requests wait for the broker", self._outbox.path, len(outs), exc)
            return
        if not rows:
            self._failed = True
            self._log.warning("full", "outbox %s is too full for the %d replies of a held window; their "
                              "requests wait for the broker", self._outbox.path, len(outs))
            return
        self._failed = False
        self._flusher.adopt(rows)
        by_owner = {id(out.owner): row for out, row in zip(outs, rows)}
        with self._lock:
            moved = self._publishes.reown(by_owner)
            for mid, inbound in moved:
                if mid is not None:  # in flight: its PUBACK now deletes the row
                    self._awaiting.reown(mid, by_owner[id(inbound)])
        self.flushes += 1
        for _, inbound in moved:
            self.acks += 1
            self._ack(inbound)
