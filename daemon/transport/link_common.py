"""What the paho link (mqtt.py) and the native link (native.py) do alike, whatever the client
underneath: intake's open/close flags, the `online` announcement, and the on-disk outbox side
(a reply made while the broker is away, and the unconfirmed replies kept at stop).

A link subclasses `LinkCommon`, sets the attributes listed on it in its own `__init__`, and
supplies `publish`, `_subscribe`, `_unsubscribe`, `_unconfirmed_rows` and `unconfirmed_replies`.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from typing import NamedTuple, Optional, Sequence

from daemon.config.mqtt import MqttConfig
from daemon.obs.throttled_log import ThrottledLog
from daemon.transport.outbox import Outbox, OutboxFlusher

logger = logging.getLogger(__name__)

FAILURE_THRESHOLD = 0x80  # MQTT reason codes >= 0x80 are failures
STATUS_ONLINE = b"online"
STATUS_OFFLINE = b"offline"
# A stored reply: topic, payload, CorrelationData.
StoredReply = tuple[str, bytes, Optional[bytes]]


class Out(NamedTuple):
    """One publish as a link keeps it until the broker has it (native re-encodes it to resend; paho
    holds it back while the broker's window is full: paho_window.py)."""

    topic: str
    payload: bytes
    retain: bool
    correlation_data: Optional[bytes]
    response_topic: Optional[str]
    owner: Optional[object]  # what waits for its PUBACK (daemon/transport/puback.py), or None


class LinkCommon:
    """The halves of `MqttLink`'s interface that do not depend on the MQTT client."""

    _config: MqttConfig
    _filters: tuple[str, ...]
    _accepting: threading.Event  # until close_intake: a resumed session delivers before we subscribe
    _subscribing: threading.Event
    _log: ThrottledLog
    _flusher: Optional[OutboxFlusher]
    connected: threading.Event
    online: threading.Event  # set once subscribed and announced (systemd's READY=1)
    outbox: Optional[Outbox]
    reconnects: int  # times the daemon came back online after the first time
    acks_after_outbox = 0  # the native link's safe_ack.py; the paho link never acks on the disk's word
    nudges = 0  # the native link's PINGREQs to a broker silent while replies waited (native_conn.py)
    unacked_holds = 0  # the native link's: times it stopped reading at ReceiveMaximum requests unacked

    def open_intake(self) -> None:
        """Subscribe now if connected, and on every (re)connect; then announce `online`."""
        self._subscribing.set()
        if self.connected.is_set():
            self._subscribe()

    def close_intake(self) -> None:
        """Stop handing on requests; what arrives now stays unacked. A persistent session keeps
        the subscriptions, so the broker holds (and redelivers) requests for the next run."""
        self._accepting.clear()
        self._subscribing.clear()
        if self.connected.is_set() and self._filters and not self._config.persistent:
            self._unsubscribe()

    def _subscribed(self, codes: Sequence[tuple[int, str]]) -> None:
        """The SUBACK's (reason code, its words) per filter: each refusal logged; `online` unless all were."""
        refused = 0
        for topic_filter, (code, text) in zip(self._filters, codes, strict=False):
            if code >= FAILURE_THRESHOLD:
                refused += 1
                logger.error("broker refused the subscription to %r: %s", topic_filter, text)
        if refused and refused == len(self._filters):
            logger.error("broker refused every subscription: this daemon serves nothing and stays offline "
                         "(check mqtt.share_group and the broker's ACLs); it subscribes again at every reconnect")
        elif refused < len(self._filters) and self._subscribing.is_set():
            self._announce_online()

    def _announce_online(self) -> None:
        """`online` once subscribed (after SUBACK): never while requests would go unheard."""
        if self.online.is_set():
            self.reconnects += 1
        self.publish(self._config.status_topic, STATUS_ONLINE, retain=True)
        self.online.set()

    def outbox_state(self) -> dict:
        """The stats' `outbox`: the publishes the broker has not confirmed, and the on-disk outbox's rows."""
        state = {"unconfirmed": self.unconfirmed_replies, "acks_after_outbox": self.acks_after_outbox,
                 "nudges": self.nudges, "unacked_holds": self.unacked_holds}
        if self.outbox is not None:
            state.update(self.outbox.snapshot())
        return state

    def _stored_while_away(self, topic: str, payload: bytes, correlation_data: Optional[bytes]) -> bool:
        """While the broker is away a reply goes to the outbox (True), its request left unacked: the
        broker redelivers it on reconnect (a duplicate reply, cheap through the cache). False: send it."""
        if self.outbox is None or self.connected.is_set():
            return False
        try:
            self.outbox.put_many([(topic, payload, correlation_data)])
        except (OSError, sqlite3.Error) as exc:  # e.g. a full disk: the client's memory holds it instead
            self._log.warning("outbox", "outbox %s: %s; the reply waits in memory", self.outbox.path, exc)
            return False
        self._flusher.wake()
        return True

    def _close_outbox(self) -> None:
        """At stop, once the client is down: keep its unconfirmed replies in the outbox for the next run."""
        if self.outbox is None:
            return
        try:
            self._keep(self._unconfirmed_rows())
        except (OSError, sqlite3.Error) as exc:
            logger.error("outbox %s: cannot keep the unconfirmed replies (%s); their requests are "
                         "redelivered by the broker", self.outbox.path, exc)
        self.outbox.close()

    def _keep(self, rows: Sequence[StoredReply]) -> None:
        if rows:
            kept = self.outbox.put_many(rows)
            logger.warning("%d unconfirmed repl%s kept in the outbox %s for the next run%s", kept,
                           "y" if kept == 1 else "ies", self.outbox.path,
                           f" ({len(rows) - kept} did not fit)" if kept < len(rows) else "")

    # -- supplied by each link --

    def publish(self, topic: str, payload: bytes, retain: bool = False, correlation_data: Optional[bytes] = None,
                response_topic: Optional[str] = None) -> object:
        raise NotImplementedError

    def _subscribe(self) -> None:
        raise NotImplementedError

    def _unsubscribe(self) -> None:
        raise NotImplementedError

    def _unconfirmed_rows(self) -> list[StoredReply]:
        """The replies (only they: not status, stats, outbox rows or escalations) the broker has not confirmed."""
        raise NotImplementedError

    @property
    def unconfirmed_replies(self) -> int:
        raise NotImplementedError
