"""The MQTT v5 link (what `mqtt.transport: auto` picks for v5): mqtt.py's MqttLink on a compiled codec.

Same constructor, same public interface and the same delivery rules as the paho link
(daemon/transport/mqtt.py's module doc lists them; each holds here too): a persistent
session, a request acked only once its reply's PUBACK is back, the CONNECT's
ReceiveMaximum, retained messages acked and dropped, the LWT `offline`, the on-disk outbox
while the broker is away and the spill of unconfirmed replies on stop, TCP_NODELAY,
subscribe after a good CONNACK and again on every reconnect, Retain Handling 2. It reuses
link_health.py (causes logged), puback.py and outbox.py as they are.

What differs is underneath. The packets are encoded and decoded by the `mqtt5` package (a
Rust codec that does no I/O: native_wire.py), and one network thread does all the socket
I/O (native_conn.py) without paho's per-packet Python: no property objects, no
MQTTMessageInfo and its Condition, no walk of the in-flight list per PUBACK. What one
read brings in goes to intake as one burst, and the PUBACKs and replies it causes leave in
one write. Workers publish from their own threads: a packet goes onto the output list under
one lock and the loop is woken through a socketpair once per `batch()` (or per call outside
one; native_wake.py); the network thread's own writes wake nothing.

One delivery rule is the native link's own: where the broker holds its window to us full
(rumqttd 0.20 confirms none of our publishes while 100 messages to us are unacked), a request
is acked once its reply is on disk in the outbox instead of once it is PUBACKed; the row goes
on the PUBACK, and a restart sends it again (safe_ack.py says when).

MQTT v5 only, QoS 0 or 1 (config check refuses the rest, naming `mqtt.transport`).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from contextlib import AbstractContextManager
from typing import Callable, Optional, Sequence

import mqtt5

from daemon.config.mqtt import MqttConfig, wants_retained
from daemon.obs.throttled_log import ThrottledLog
from daemon.transport import native_wire as wire
from daemon.transport.ack_order import AckOrder
from daemon.transport.broker_grants import GrantLog, Grants
from daemon.transport.inbound import Inbound
from daemon.transport.link_common import FAILURE_THRESHOLD, STATUS_OFFLINE, LinkCommon, Out, StoredReply
from daemon.transport.link_health import LinkHealth
from daemon.transport.mqtt import OFFLINE_PUBLISH_TIMEOUT_S, REPLY_WINDOW
from daemon.transport.native_conn import Connection, Dead
from daemon.transport.native_wake import Wakeup
from daemon.transport.native_window import PublishWindow
from daemon.transport.outbox import Outbox, OutboxFlusher, Row
from daemon.transport.puback import AwaitingPuback
from daemon.transport.safe_ack import SafeAck

logger = logging.getLogger(__name__)
# stop() waits this much longer than a connect may take for the network thread to end.
JOIN_MARGIN_S = 1.0
DISCONNECT = mqtt5.DisconnectPacket().write()


class NativeLink(LinkCommon):
    """One MQTT v5 connection on the mqtt5 codec: status, intake of the given filters, replies, acks."""

    def __init__(self, config: MqttConfig, filters: Sequence[str], on_burst: Callable[[Sequence[Inbound]], None],
                 receive_maximum: Optional[int] = None, outbox: Optional[Outbox] = None,
                 may_read: Callable[[], bool] = lambda: True, largest_request: int = 0):
        """`may_read`: False while the daemon's byte budget is full; nothing more is read until it
        is True again, so the backlog waits at the broker (serve/admission.py). `largest_request`:
        as mqtt.MqttLink's."""
        self._config = config
        self._grants = GrantLog(config, receive_maximum or REPLY_WINDOW, largest_request)
        self._acks = AckOrder(self._send_acks)
        self._may_read = may_read
        self._receive_maximum = receive_maximum
        self._filters = tuple(config.subscription(f) for f in filters)  # routing matches the bare filters
        self._handler = on_burst
        self._qos = mqtt5.QoS(config.qos)
        self._accepting = threading.Event()
        self._accepting.set()  # until close_intake: a resumed session delivers before we subscribe
        self._subscribing = threading.Event()
        self.connected = threading.Event()
        self.online = threading.Event()  # set once subscribed and announced (systemd's READY=1)
        self.reconnects = 0  # times the daemon came back online after the first time
        self._nudged = 0  # nudges of connections that have ended
        self._conn: Optional[Connection] = None  # the live one, for `nudges`
        self._tls = wire.tls_context(config)
        self._will = mqtt5.Will(config.status_topic, payload=STATUS_OFFLINE, qos=mqtt5.QoS.AT_LEAST_ONCE,
                                retain=True)
        self._health = LinkHealth(config.url, config.client_id, config.reconnect_min_s, config.reconnect_max_s)
        self._log = ThrottledLog(logger)
        self._safe = AwaitingPuback(self._published)
        self._lock = threading.Lock()  # the window, the output list, `_live` and `_sub_mid`
        self._window = PublishWindow(receive_maximum or REPLY_WINDOW)
        self._out: list[bytes] = []  # packets for the network thread to write, in order
        self._live = False  # a connection past its CONNACK: packets may go onto `_out`
        self._sub_mid: Optional[int] = None  # the SUBSCRIBE whose SUBACK announces `online`
        self._wakeup = Wakeup()
        self._stop = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="mqtt-native", daemon=True)
        self.outbox = outbox
        self._flusher = OutboxFlusher(outbox, self._flush, self.connected) if outbox is not None else None
        self._held = SafeAck(min(receive_maximum or REPLY_WINDOW, config.outbox.broker_window), self._acks,
                             self._lock, self._window, self._safe, outbox, self._flusher, self.ack)
        # Requests read and not yet acked, at most: our ReceiveMaximum (a broker that overruns it is
        # not read from until we are back under it, module doc).
        self._unacked_limit = receive_maximum or REPLY_WINDOW
        self._held_unacked = False
        self.unacked_holds = 0  # times reading stopped at that limit (stats `outbox.unacked_holds`)

    # -- the interface the daemon uses (mqtt.MqttLink's) --

    def start(self) -> None:
        """Connect in the background; retries with capped backoff while the broker is down."""
        logger.info("connecting to %s as %r (MQTT v5, native transport)", self._config.url, self._config.client_id)
        self._thread.start()
        if self._flusher is not None:
            self._flusher.start()

    def _unsubscribe(self) -> None:
        with self._lock:
            self._write(mqtt5.UnsubscribePacket(self._window.new_id(), list(self._filters)).write())
        self._wakeup.kick()

    def publish(self, topic: str, payload: bytes, retain: bool = False, correlation_data: Optional[bytes] = None,
                response_topic: Optional[str] = None) -> None:
        """Queue a publish (non-blocking; the network thread writes it); a ResponseTopic makes it
        a v5 request (daemon/serve/cascade.py escalations)."""
        self._publish(Out(topic, payload, retain, correlation_data, response_topic, None))

    def reply(self, topic: str, payload: bytes, inbound: Inbound) -> None:
        """Publish a request's reply, and ack the request once the broker has the reply. While
        the broker is away the reply goes to the outbox (link_common.py)."""
        if not self._stored_while_away(topic, payload, inbound.correlation_data):
            self._acks.answered(inbound)  # before the publish wakes the network thread (safe_ack.py)
            self._publish(Out(topic, payload, False, inbound.correlation_data, None, inbound))

    def ack(self, inbound: Inbound) -> None:
        """Acknowledge a request once its reply is published (no-op for QoS 0)."""
        if inbound.qos > 0:
            self._acks.ack(inbound)  # held until the requests received before it are acked (ack_order.py)
            self._wakeup.kick()

    def _send_acks(self, turn: list[Inbound]) -> None:
        with self._lock:
            for inbound in turn:
                self._write(mqtt5.PubAckPacket(inbound.mid).write())

    def batch(self) -> AbstractContextManager:
        """Replies and acks sent inside this block wake the network thread once, at the end."""
        return self._wakeup.batch()

    @property
    def loop_alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def acks_after_outbox(self) -> int:
        """Requests acked once their replies were on disk, the broker's window to us held (safe_ack.py)."""
        return self._held.acks

    @property
    def nudges(self) -> int:
        """PINGREQs sent because the broker was silent while replies waited for PUBACKs (native_conn.py)."""
        conn = self._conn
        return self._nudged + (conn.nudges if conn is not None else 0)

    @property
    def unconfirmed_replies(self) -> int:
        """Publishes the broker has not confirmed yet (in flight or queued behind the window)."""
        return self._window.pending

    def stop(self, timeout_s: float = OFFLINE_PUBLISH_TIMEOUT_S) -> None:
        """Publish the retained `offline`, wait for it briefly, disconnect; then keep the replies
        the broker has not confirmed in the outbox, for the next run."""
        self._stopping = True
        if self._flusher is not None:
            self._flusher.stop()
        if self.connected.is_set():
            done = threading.Event()
            self._publish(Out(self._config.status_topic, STATUS_OFFLINE, True, None, None, done))
            if not done.wait(timeout_s):
                logger.warning("could not publish offline status: no PUBACK within %.1f s", timeout_s)
        self._stop.set()
        self._wakeup.wake()
        if self._thread.ident is not None:
            self._thread.join(wire.CONNECT_TIMEOUT_S + JOIN_MARGIN_S)
        self._close_outbox()
        self._wakeup.close()

    # -- publishing (any thread) --

    def _publish(self, out: Out) -> None:
        if self._qos == mqtt5.QoS.AT_MOST_ONCE:
            with self._lock:
                self._write(self._encode(None, out, False))
            self._wakeup.kick()
            if out.owner is not None:
                self._published(out.owner)  # QoS 0 is never acknowledged; nothing to wait for
            return
        with self._lock:
            mid = self._window.offer(out)
            if mid is not None:
                self._sent(mid, out)
        self._wakeup.kick()

    def _sent(self, mid: int, out: Out) -> None:
        """A publish entered the window (caller holds the lock): its PUBACK completes `out.owner`."""
        self._safe.register(mid, out.owner)
        self._write(self._encode(mid, out, False))

    def _encode(self, mid: Optional[int], out: Out, dup: bool) -> bytes:
        return mqtt5.PublishPacket(out.topic, out.payload, qos=self._qos, retain=out.retain, packet_id=mid,
                                   duplicate=dup, correlation_data=out.correlation_data,
                                   response_topic=out.response_topic).write()

    def _write(self, packet: bytes) -> None:
        """Caller holds the lock. Dropped while no connection is live: the window resends
        publishes on connect, and an ack lost here is a redelivery (a duplicate reply)."""
        if self._live:
            self._out.append(packet)

    def _flush(self, row: Row) -> None:
        """The outbox flusher's thread: hand one stored reply on; removed on its PUBACK."""
        self._publish(Out(row.topic, row.payload, False, row.correlation_data, None, row))

    def _published(self, owner: object) -> None:
        """The broker has the publish `owner` waited for: ack its request, drop its outbox row,
        or tell stop() its `offline` is out."""
        if isinstance(owner, Inbound):
            self.ack(owner)
        elif isinstance(owner, Row) and self._flusher is not None:
            self._flusher.confirmed(owner)
        elif isinstance(owner, threading.Event):
            owner.set()

    def _unconfirmed_rows(self) -> list[StoredReply]:
        with self._lock:
            left = [o for o in self._window.take_all() if isinstance(o.owner, Inbound)]
        return [(o.topic, o.payload, o.correlation_data) for o in left]

    # -- the network thread --

    def _run(self) -> None:
        self._wakeup.loop_ident = threading.get_ident()
        while not self._stop.is_set():
            try:
                dialled = self._dial()
                if dialled is not None:
                    self._session(*dialled)
            except Exception:  # a bug must not end the thread: log it, reconnect
                logger.exception("the MQTT network thread failed; reconnecting")
                self._dropped()
            if not self._stop.is_set():
                self._stop.wait(self._health.next_retry_s())

    def _dial(self) -> Optional[tuple]:
        """A socket past a good CONNACK, or None (the cause logged by link_health)."""
        frames = wire.Frames()
        try:
            sock = wire.open_socket(self._config, self._tls)
        except OSError as exc:
            self._health.connect_failed(exc, self._config.host, self._config.port)
            return None
        try:
            sock.sendall(wire.connect_packet(self._config, self._receive_maximum, self._will))
            connack, early = wire.read_connack(sock, frames)
        except (OSError, wire.ProtocolError) as exc:
            sock.close()
            self._health.connect_failed(exc, self._config.host, self._config.port)
            return None
        if int(connack.reason_code) >= FAILURE_THRESHOLD:  # mqtt5's enums are not ints
            sock.close()
            self._health.refused(int(connack.reason_code), wire.reason_text(connack.reason_code))
            return None
        return sock, frames, connack, early

    def _session(self, sock: socket.socket, frames: wire.Frames, connack: mqtt5.ConnAckPacket, early: list) -> None:
        """Serve one connection until it drops or stop(); a drop is logged with its cause."""
        conn = Connection(sock, frames, self._wakeup.reader, connack.server_keep_alive or self._config.keepalive_s)
        self._conn = conn
        self._connected(connack)
        try:
            self._handle(early)
            self._serve(conn)
            self._send_out(conn)
            conn.goodbye(DISCONNECT)  # stop(): a clean DISCONNECT, so no LWT
        except (Dead, wire.ProtocolError, OSError) as exc:
            code = exc.code if isinstance(exc, Dead) else Dead.UNSPECIFIED
            if not self._stopping:
                self._health.dropped(code, exc.reason if isinstance(exc, Dead) else str(exc))
        finally:
            self._dropped()
            self._nudged, self._conn = self._nudged + conn.nudges, None
            conn.close()

    def _serve(self, conn: Connection) -> None:
        while not self._stop.is_set():
            self._send_out(conn)
            waiting = self._window.unacked > 0  # publishes wait for PUBACKs: a silent broker is nudged
            due = [t for t in (self._held.due(), conn.nudge_due() if waiting else None) if t is not None]
            readable, woken = conn.wait(self._reads(), min(due, default=None))
            if woken:
                self._wakeup.drained()  # before `_out` is taken, at the top of the next pass
            if readable:
                self._handle(conn.read())
            self._held.check()
            ping = conn.keepalive() or (conn.nudge() if waiting else None)
            if ping is not None:
                with self._lock:
                    self._write(ping)

    def _reads(self) -> bool:
        """Whether the socket is read now: the byte budget has room, and fewer requests than our
        ReceiveMaximum wait for their acks, unless only reading can move them (safe_ack.py)."""
        if not self._may_read():
            return False
        held = self._acks.waiting >= self._unacked_limit and self._held.can_relieve
        if held and not self._held_unacked:
            self.unacked_holds += 1
        self._held_unacked = held
        return not held

    def _send_out(self, conn: Connection) -> None:
        with self._lock:
            out, self._out = self._out, []
        conn.send(out[0] if len(out) == 1 else b"".join(out))

    def _connected(self, connack: mqtt5.ConnAckPacket) -> None:
        """A good CONNACK: resend what was in flight, then subscribe (again)."""
        logger.info("connected to %s", self._config.url)
        self._health.connected()
        self._acks.new_connection()
        self._grants.connack(Grants(connack.session_present, connack.session_expiry_interval, connack.receive_max,
                                    connack.max_packet_size, connack.shared_subscription_available))
        with self._lock:
            self._out = []
            self._window.limit = max(1, min(self._receive_maximum or REPLY_WINDOW, connack.receive_max))
            for mid, out in self._window.in_flight():
                self._out.append(self._encode(mid, out, connack.session_present))
            self._live = True
            for mid, out in self._window.fill():
                self._sent(mid, out)
        self.connected.set()
        if self._flusher is not None:
            self._flusher.wake()
        if self._subscribing.is_set():
            self._subscribe()

    def _dropped(self) -> None:
        with self._lock:
            self._live = False
            self._out = []
        self.connected.clear()

    def _subscribe(self) -> None:
        if not self._filters:
            self._announce_online()
            return
        filters = [mqtt5.TopicFilter(f, max_qos=self._qos, retain_as_published=True,
                                     retain_handling=mqtt5.RetainHandling.SEND_ALWAYS if wants_retained(f)
                                     else mqtt5.RetainHandling.SEND_NEVER) for f in self._filters]
        with self._lock:
            self._sub_mid = self._window.new_id()
            self._write(mqtt5.SubscribePacket(self._sub_mid, filters).write())
        self._wakeup.kick()

    def _handle(self, packets: list) -> None:
        """One read burst: PUBACKs complete what waited, requests go to intake in one call."""
        inbounds, acked = [], []
        for packet in packets:
            kind = type(packet)
            if kind is mqtt5.PublishPacket:
                if not self._accepting.is_set():
                    continue  # stopping: leave it unacked (see close_intake)
                inbound = self._convert(packet)
                self._acks.arrived(inbound)  # PUBACKs go out in this order (ack_order.py)
                if packet.retain and not wants_retained(packet.topic):  # not a request (a fleet document is)
                    self._acks.ack(inbound)
                    continue
                inbounds.append(inbound)
            elif kind is mqtt5.PubAckPacket:
                acked.append(packet.packet_id)
            else:
                self._control(packet)
        if acked:
            self._completed(acked)
        if inbounds:
            try:
                self._handler(inbounds)
            except Exception:  # the network thread must survive anything a message does
                logger.exception("failed to hand on %d message(s)", len(inbounds))

    @staticmethod
    def _convert(packet: mqtt5.PublishPacket) -> Inbound:
        return Inbound(topic=packet.topic, payload=packet.payload, qos=1 if packet.packet_id is not None else 0,
                       mid=packet.packet_id or 0, received_at=time.monotonic(),
                       response_topic=packet.response_topic, correlation_data=packet.correlation_data,
                       expiry_s=packet.message_expiry_interval)

    def _completed(self, mids: list[int]) -> None:
        ours = []
        with self._lock:
            for mid in mids:
                known, admitted = self._window.acked(mid)
                if known:
                    ours.append(mid)
                for next_mid, out in admitted:
                    self._sent(next_mid, out)
        if ours:
            self._held.heard()
        for mid in ours:
            self._safe.completed(mid)

    def _control(self, packet: object) -> None:
        if isinstance(packet, mqtt5.SubAckPacket):
            self._on_suback(packet)
        elif isinstance(packet, mqtt5.DisconnectPacket):
            raise Dead(f"the broker sent DISCONNECT: {wire.reason_text(packet.reason_code)}",
                       int(packet.reason_code))
        elif not isinstance(packet, mqtt5.UnsubAckPacket):
            self._log.warning("unexpected", "ignored an unexpected %s from the broker", type(packet).__name__)

    def _on_suback(self, packet: mqtt5.SubAckPacket) -> None:
        if packet.packet_id != self._sub_mid:
            return  # an earlier SUBSCRIBE of this connection (open_intake raced a reconnect)
        self._subscribed([(int(code), wire.reason_text(code)) for code in packet.reason_codes])
