"""The paho link (MQTT 3.1.1, and v5 where the native link's wheel is missing): connect,
reconnect, subscribe, status, publish, ack.

paho runs as shipped: no private method of it is overridden. Its network thread is
paho_loop.py's, over paho's public external-loop calls (for a connect failure's cause, read
bursts and holding). Callbacks only convert and hand on; they never decode, infer or block.
paho quirks that shape this module:
- `connect_async` only stores the address; the network thread connects, and retries
  while the broker is down, so the daemon starts even when the broker is down at boot.
- Subscriptions are made in `on_connect` (after checking its reason code) so that a
  reconnect resubscribes.
- An exception escaping a callback stops paho's loop thread unless
  `suppress_exceptions` is set, so `on_message` guards the hand-off itself.
- `wait_for_publish()` inside a callback deadlocks (paho #527, #875); it is used only
  in `stop()`, which runs on the main thread.
- paho leaves Nagle's algorithm on: replies waited ~40 ms for delayed ACKs until
  `on_connect` set TCP_NODELAY (88 ms round trip -> see docs/performance.md).
- The LWT is not sent on a clean disconnect: `stop()` publishes `offline` itself.
- `manual_ack=True`: a QoS>0 request is acknowledged only once its reply is safe at
  the broker: the reply's own PUBACK is back (`on_publish` with the reply's mid). Acking
  when the reply was merely queued lost requests: past 20 replies in flight paho holds
  further QoS 1 publishes in memory but writes PUBACKs at once, so a daemon killed then
  had acked requests whose replies never left (measured: 238 of 600 unanswered after a
  SIGKILL and restart). With MQTT v5 the CONNECT carries ReceiveMaximum (see
  daemon/lifecycle/service.py, `receive_maximum`, for why it is bounded).
- A persistent session (`mqtt.session_expiry_s` > 0: v5 `clean_start=False` with a
  SessionExpiryInterval, 3.1.1 `clean_session=False`) keeps the subscriptions and the
  unacked requests at the broker while the daemon is away; the broker redelivers them
  on reconnect, right after CONNACK and before any SUBSCRIBE. So requests are handed
  on from the first connect (intake queues them until the workers start), and
  `close_intake` keeps the subscriptions: what arrives after it stays unacked and is
  redelivered to the next run.
- While the broker is away (`connected` clear) a reply goes to the on-disk outbox
  (outbox.py), not into paho's memory; paho resends only what it was handed before the
  connection dropped, and `stop()` moves what it still holds unconfirmed (`drop_out_messages`)
  to the outbox. The flusher hands stored rows to paho once connected, each only once.
- paho is given no window of QoS 1 publishes in flight (its default is 20; `_paho_client`
  says why none): the link keeps the request window (ReceiveMaximum), a reply per request
  in flight, and a v5 broker's own ReceiveMaximum from each CONNACK, which paho 2.x reads
  but does not keep to (MQTT 5, 4.9.0; paho_window.py).
- Retained messages are not requests: v5 subscribes with Retain Handling 2 (none sent
  on subscribe) and Retain As Published, and any message with the retain flag (a
  retained delivery, or an empty retained clear) is acked and dropped; but for the fleet's
  desired documents (`edge-inferd/fleet/...`), which are retained on purpose and sent on subscribe.
- Intake gets the requests of one read burst (all that one `loop_read()` decoded,
  at most MAX_BURST or MAX_BURST_BYTES) in one call, in order, at the pass's end
  (paho_loop.py): one hand-off per burst, not per message.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from contextlib import AbstractContextManager, nullcontext
from typing import Callable, Optional, Sequence

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from daemon.config.mqtt import MqttConfig, wants_retained
from daemon.transport.ack_order import AckOrder
from daemon.transport.broker_grants import NO_RECEIVE_LIMIT, GrantLog, Grants
from daemon.transport.inbound import Inbound
from daemon.transport.link_common import STATUS_OFFLINE, LinkCommon, Out, StoredReply
from daemon.transport.link_health import LinkHealth
from daemon.transport.outbox import Outbox, OutboxFlusher, Row
from daemon.transport.puback import AwaitingPuback
from daemon.transport.paho_loop import PahoLoop
from daemon.transport.paho_window import Window
from daemon.obs.throttled_log import ThrottledLog

logger = logging.getLogger(__name__)
# Time allowed to get the retained `offline` status out on a stop.
OFFLINE_PUBLISH_TIMEOUT_S = 2.0

_STATUS_QOS = 1
# Replies (QoS > 0) in flight to the broker at once when no ReceiveMaximum is given.
REPLY_WINDOW = 1024
# Requests handed to intake in one call at most: a long burst is handed on in parts, so the
# first of its requests waits for at most this many to be decoded (~1 ms), not the whole burst
# (a backlog reads as one burst for as long as bytes keep coming).
MAX_BURST = 64
# ... or of at most about these many payload bytes: admission sees a filling budget within a read
# burst, and reading holds (paho_loop.py) before the next pass takes in more.
MAX_BURST_BYTES = 1 << 16


def disable_nagle(sock: object) -> None:
    """Small replies must not wait for Nagle + delayed ACK (~40 ms each way); paho leaves it on."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except (AttributeError, OSError) as exc:  # e.g. a unix or websocket transport
        logger.debug("TCP_NODELAY not set: %s", exc)


def stop_loop(client: paho.Client, timeout_s: Optional[float] = None) -> None:
    """`loop_stop()` without its race (eclipse-paho #872): paho's thread sets `_thread = None` as it
    ends, which can fall between loop_stop's None check and its `join()` (an AttributeError, seen
    on a slow machine right after `disconnect()`). The thread is taken once, then joined."""
    thread = client._thread
    client._thread_terminate = True
    if thread is not None and thread is not threading.current_thread():
        thread.join(timeout_s)


def _grants(flags: object, properties: Optional[Properties]) -> Grants:
    """paho's CONNACK flags and properties (a property the broker left out is not an attribute)."""
    return Grants(session_present=bool(getattr(flags, "session_present", False)),
                  session_expiry_s=getattr(properties, "SessionExpiryInterval", None),
                  receive_maximum=getattr(properties, "ReceiveMaximum", NO_RECEIVE_LIMIT),
                  maximum_packet_size=getattr(properties, "MaximumPacketSize", None),
                  shared_subscriptions=bool(getattr(properties, "SharedSubscriptionAvailable", 1)))


def _paho_client(config: MqttConfig) -> paho.Client:
    """paho configured from `mqtt:`: protocol and session, login, TLS, no window of its own, and the
    LWT (callbacks are the link's to set)."""
    protocol = paho.MQTTv5 if config.is_v5 else paho.MQTTv311
    clean_session = None if config.is_v5 else not config.persistent
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=config.client_id, protocol=protocol,
                    clean_session=clean_session, manual_ack=True)
    if config.username is not None:
        client.username_pw_set(config.username, config.password)
    if config.tls is not None:
        tls = config.tls
        # paho's defaults: CERT_REQUIRED and hostname verification (tls_insecure stays False).
        client.tls_set(ca_certs=_path(tls.ca_file), certfile=_path(tls.cert_file), keyfile=_path(tls.key_file))
    # paho keeps 20 QoS 1 publishes in flight by default and queues the rest in memory: with
    # requests acked only after their reply's PUBACK, 20 replies per broker round trip capped
    # the daemon below its drain rate under sustained load (soak at 0.8x: 71,723 of 213,979
    # unanswered in the minute, 10,832 replies queued; with the request window: 0 of 214,368).
    # With any limit set, paho walks every unacknowledged publish on each PUBACK to find a held
    # one (`_update_inflight`: 72% of its thread's samples with 1,024 in flight); with none (0)
    # it never walks. The window is kept by the link instead (paho_window.py), which also keeps
    # to a v5 broker's ReceiveMaximum.
    client.max_inflight_messages_set(0)
    client.will_set(config.status_topic, STATUS_OFFLINE, qos=_STATUS_QOS, retain=True)
    return client


def _path(value: Optional[object]) -> Optional[str]:
    return None if value is None else str(value)


class MqttLink(LinkCommon):
    """One paho client: status, intake of the given filters, replies and acks."""

    def __init__(self, config: MqttConfig, filters: Sequence[str], on_burst: Callable[[Sequence[Inbound]], None],
                 receive_maximum: Optional[int] = None, outbox: Optional[Outbox] = None, largest_request: int = 0,
                 may_read: Callable[[], bool] = lambda: True):
        """`largest_request`: the largest request payload a route accepts, checked against the broker's
        Maximum Packet Size (broker_grants.py). `may_read`: False while the daemon's byte budget is
        full; nothing more is read until it is True again (paho_loop.py, "Holding")."""
        self._config = config
        self._receive_maximum = receive_maximum
        self._grants = GrantLog(config, receive_maximum or REPLY_WINDOW, largest_request)
        self._acks = AckOrder(self._send_acks)
        self._filters = tuple(config.subscription(f) for f in filters)  # routing matches the bare filters
        self._handler = on_burst  # the requests of one read burst, in order (one hand-off, not one per message)
        self._burst: list[Inbound] = []  # the read burst so far (paho's loop thread only)
        self._burst_bytes = 0  # its payloads' bytes
        self._accepting = threading.Event()
        self._accepting.set()  # until close_intake: a resumed session delivers before we subscribe
        self._subscribing = threading.Event()
        self.connected = threading.Event()
        self._window_size = receive_maximum or REPLY_WINDOW
        self._window: Window[Out] = Window(self._send)
        self._client = _paho_client(config)
        self._client.on_connect = self._on_connect
        self._client.on_disconnect = self._on_disconnect
        self._client.on_subscribe = self._on_subscribe
        self._client.on_message = self._on_message
        self._client.on_publish = self._on_publish
        self._log = ThrottledLog(logger)
        self._health = LinkHealth(config.url, config.client_id, config.reconnect_min_s, config.reconnect_max_s)
        self._may_read = may_read
        self._loop = PahoLoop(self._client, self._hand_on_burst, may_read, self._connect_failed,
                              self._health.next_retry_s, config.keepalive_s)
        self._stopping = False
        self._safe = AwaitingPuback(self._published)
        self.outbox = outbox
        self._flusher = OutboxFlusher(outbox, self._flush, self.connected) if outbox is not None else None
        self.online = threading.Event()  # set once subscribed and announced (systemd's READY=1)
        self.reconnects = 0  # times the daemon came back online after the first time

    def start(self) -> None:
        """Connect in the background; retries with capped backoff while the broker is down."""
        logger.info("connecting to %s as %r (MQTT %s, paho transport)", self._config.url, self._config.client_id,
                    "v5" if self._config.is_v5 else "3.1.1")
        options: dict = {}
        if self._config.is_v5:
            properties = Properties(PacketTypes.CONNECT)
            if self._receive_maximum:
                properties.ReceiveMaximum = self._receive_maximum
            if self._config.persistent:
                properties.SessionExpiryInterval = self._config.session_expiry_s
            options = {"properties": properties, "clean_start": not self._config.persistent}
        self._client.connect_async(self._config.host, self._config.port, keepalive=self._config.keepalive_s,
                                   **options)
        self._loop.start()
        if self._flusher is not None:
            self._flusher.start()

    def _unsubscribe(self) -> None:
        self._client.unsubscribe(list(self._filters))

    def _subscribe(self) -> None:
        if self._filters:
            qos = self._config.qos
            if self._config.is_v5:
                self._client.subscribe([(f, SubscribeOptions(
                    qos=qos, retainAsPublished=True, retainHandling=SubscribeOptions.RETAIN_SEND_ON_SUBSCRIBE
                    if wants_retained(f) else SubscribeOptions.RETAIN_DO_NOT_SEND)) for f in self._filters])
            else:
                self._client.subscribe([(f, qos) for f in self._filters])
        else:
            self._announce_online()

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        if reason_code.is_failure:
            self._health.refused(reason_code.value, reason_code)
            return
        logger.info("connected to %s", self._config.url)
        self._health.connected()
        self._acks.new_connection()
        grants = _grants(flags, properties)
        self._grants.connack(grants)
        self._window.connected(min(self._window_size, grants.receive_maximum))  # MQTT 5 4.9.0 (paho_window.py)
        disable_nagle(client.socket())
        self.connected.set()
        if self._flusher is not None:
            self._flusher.wake()
        if self._subscribing.is_set():
            self._subscribe()

    def _connect_failed(self, error: Exception) -> None:
        self._health.connect_failed(error, self._config.host, self._config.port)

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        was_connected = self.connected.is_set()
        self.connected.clear()
        if was_connected and reason_code != 0 and not self._stopping:
            self._health.dropped(getattr(reason_code, "value", reason_code), reason_code)

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties) -> None:
        self._subscribed([(code.value, str(code)) for code in reason_codes])

    def _on_message(self, client, userdata, msg: paho.MQTTMessage) -> None:
        try:
            if not self._accepting.is_set():
                return  # stopping: leave it unacked (see close_intake)
            inbound = self._convert(msg)
            self._acks.arrived(inbound)  # PUBACKs go out in this order (ack_order.py)
            if msg.retain and not wants_retained(msg.topic):  # not a request (module doc)
                self._acks.ack(inbound)
                return
            if not self._may_read():  # the byte budget is full: hold inside this read pass (paho_loop.py)
                self._hand_on_burst()
                self._loop.hold()
            self._burst.append(inbound)
            self._burst_bytes += len(inbound.payload)
            if len(self._burst) >= MAX_BURST or self._burst_bytes >= MAX_BURST_BYTES:
                self._hand_on_burst()
        except Exception:  # paho's loop thread must survive anything a message does
            logger.exception("failed to hand on a message from %r", msg.topic)

    def _hand_on_burst(self) -> None:
        """End of a read burst (paho's loop thread): its requests to intake, in one call. After
        close_intake they stay unacked instead, for the broker to redeliver."""
        burst = self._burst
        if not burst:
            return
        self._burst, self._burst_bytes = [], 0
        if not self._accepting.is_set():
            return
        try:
            self._handler(burst)
        except Exception:  # paho's loop thread must survive anything a handler does
            logger.exception("failed to hand on %d message(s) from %r", len(burst), burst[0].topic)

    @staticmethod
    def _convert(msg: paho.MQTTMessage) -> Inbound:
        props = msg.properties  # None for a 3.1.1 message, and for a v5 one without properties
        if props is None:
            return Inbound(msg.topic, msg.payload, msg.qos, msg.mid, time.monotonic())
        return Inbound(
            topic=msg.topic,
            payload=msg.payload,
            qos=msg.qos,
            mid=msg.mid,
            received_at=time.monotonic(),
            response_topic=getattr(props, "ResponseTopic", None),
            correlation_data=getattr(props, "CorrelationData", None),
            expiry_s=getattr(props, "MessageExpiryInterval", None),
        )

    def publish(self, topic: str, payload: bytes, retain: bool = False, correlation_data: Optional[bytes] = None,
                response_topic: Optional[str] = None) -> paho.MQTTMessageInfo:
        """Queue a publish (non-blocking; paho sends it from its loop thread); a ResponseTopic
        makes it a v5 request (daemon/serve/cascade.py escalations)."""
        return self._publish(topic, payload, retain, correlation_data, None, response_topic)

    def reply(self, topic: str, payload: bytes, inbound: Inbound) -> None:
        """Publish a request's reply, and ack the request once the broker has the reply. While
        the broker is away the reply goes to the outbox (link_common.py)."""
        if not self._stored_while_away(topic, payload, inbound.correlation_data):
            self._publish(topic, payload, False, inbound.correlation_data, inbound)

    def _flush(self, row: Row) -> None:
        """The outbox flusher's thread: hand one stored reply to paho; removed on its PUBACK."""
        self._publish(row.topic, row.payload, False, row.correlation_data, row)

    def _published(self, owner: object) -> None:
        """The broker has the publish `owner` waited for: ack its request, or drop its outbox row."""
        if self._config.qos > 0:
            self._window.confirmed()  # every publish with an owner was counted (paho_window.py)
        if isinstance(owner, Inbound):
            self.ack(owner)
        elif isinstance(owner, Row) and self._flusher is not None:
            self._flusher.confirmed(owner)

    def _publish(self, topic: str, payload: bytes, retain: bool, correlation_data: Optional[bytes],
                 owner: Optional[object], response_topic: Optional[str] = None) -> Optional[paho.MQTTMessageInfo]:
        """A reply or outbox row (`owner`) waits its turn in the broker's window (paho_window.py);
        anything else goes at once. None: it waits."""
        out = Out(topic, payload, retain, correlation_data, response_topic, owner)
        if owner is not None and self._config.qos > 0 and not self._window.offer(out):
            return None
        return self._send(out)

    def _send(self, out: Out) -> paho.MQTTMessageInfo:
        properties = None
        if (out.correlation_data is not None or out.response_topic is not None) and self._config.is_v5:
            properties = Properties(PacketTypes.PUBLISH)
            if out.correlation_data is not None:
                properties.CorrelationData = out.correlation_data
            if out.response_topic is not None:
                properties.ResponseTopic = out.response_topic
        info = self._client.publish(out.topic, out.payload, qos=self._config.qos, retain=out.retain,
                                    properties=properties)
        if self._config.qos > 0:
            self._safe.register(info.mid, out.owner)
        elif out.owner is not None:
            self._published(out.owner)  # QoS 0 replies are never acknowledged; nothing to wait for
        return info

    def _on_publish(self, client, userdata, mid, reason_code, properties) -> None:
        if self._config.qos > 0:
            self._safe.completed(mid)

    @property
    def loop_alive(self) -> bool:
        """The network thread (paho_loop.py) is running."""
        return self._loop.alive

    @property
    def unconfirmed_replies(self) -> int:
        """Publishes the broker has not confirmed yet, held by paho for resending, and replies
        waiting for room in the broker's window."""
        return self._safe.pending + self._window.waiting

    def batch(self) -> AbstractContextManager:
        """Nothing to gather: each reply and ack is queued to paho, which wakes its network thread."""
        return nullcontext()

    def ack(self, inbound: Inbound) -> None:
        """Acknowledge a request once its reply is published (no-op for QoS 0)."""
        self._acks.ack(inbound)  # held until the requests received before it are acked (ack_order.py)

    def _send_acks(self, turn: list[Inbound]) -> None:
        for inbound in turn:
            self._client.ack(inbound.mid, inbound.qos)

    def stop(self, timeout_s: float = OFFLINE_PUBLISH_TIMEOUT_S) -> None:
        """Publish the retained `offline`, wait for it briefly, disconnect; then keep the replies
        the broker has not confirmed in the outbox, for the next run."""
        self._stopping = True
        if self._flusher is not None:
            self._flusher.stop()
        if self.connected.is_set():
            info = self.publish(self._config.status_topic, STATUS_OFFLINE, retain=True)
            try:
                info.wait_for_publish(timeout_s)
            except (RuntimeError, ValueError) as exc:
                logger.warning("could not publish offline status: %s", exc)
        self._client.disconnect()
        self._loop.stop(timeout_s)
        self._close_outbox()

    def _unconfirmed_rows(self) -> list[StoredReply]:
        """paho keeps only QoS 1 and 2 publishes, each registered with its owner: a reply's is its
        request; then the replies still waiting for the broker's window."""
        left = [m for m in self._client.drop_out_messages() if isinstance(self._safe.owner(m.mid), Inbound)]
        waiting = [o for o in self._window.take_waiting() if isinstance(o.owner, Inbound)]
        return ([(m.topic, m.payload, getattr(m.properties, "CorrelationData", None)) for m in left]
                + [(o.topic, o.payload, o.correlation_data) for o in waiting])
