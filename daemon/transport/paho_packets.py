"""paho's per-packet objects, made only where a packet has something to put in them.

paho builds objects for every packet that most of the daemon's packets have no use for
(timeit per packet, paho 2.2.0, x86-64; docs/performance.md, "The paho thread"):
- a received v5 PUBLISH: `decode_publish` makes a `Properties` and unpacks it (17.6 µs;
  2.8 µs for a 3.1.1 one), though a request without properties carries a single 0 byte;
- a received PUBACK, the one per reply: a `ReasonCode` (its table of names, 3.2 µs) and an
  empty `Properties` (8.3 µs), in 3.1.1 too (14 µs per PUBACK);
- every publish and every received message: an `MQTTMessageInfo` with its own
  `threading.Condition` (1.1 µs, and a lock round trip when the PUBACK comes), which only
  `wait_for_publish` uses: replies never wait (`MqttLink.stop` waits, for the status);
- a reply carrying CorrelationData: a `Properties` and its `pack()` (20 µs).

`Packets` decodes a PUBLISH without properties (QoS 0 or 1) and a PUBACK without properties
itself and gives anything else to paho, unchanged. Its messages carry `LightInfo` (a Condition
only once someone waits) and no `Properties` object where the packet had none
(`message.properties` is then None, also in v5). `ReplyProperties` packs CorrelationData and
ResponseTopic by hand. paho's debug log is kept: with `enable_logger` or `on_log` set, every
packet takes paho's own path.

These rely on paho 2.x internals (`_in_packet`, `_handle_publish`, `_handle_pubackcomp`,
`_do_on_publish`, `_send_publish`, `_out_messages`, `_handle_on_message`, `_packet_queue`), pinned by
`paho-mqtt>=2.2,<3`; tests/integration/test_paho_client.py checks them against the real paho.
"""

from __future__ import annotations

import struct
import threading
from typing import Any, Optional

import paho.mqtt.client as paho
from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

PUBLISH = 0x30
PUBACK = 0x40
# MQTT v5 property identifiers (MQTT 5.0, 2.2.2.2).
_RESPONSE_TOPIC = 8
_CORRELATION_DATA = 9
_VARINT_MAX = 268_435_455
_MAX_PAYLOAD = 268_435_455
_STRING_MAX = 0xFFFF
_STR16 = struct.Struct("!H")
_PUBACK_PACKET = struct.Struct("!BBH")  # command, remaining length 2, mid
_NO_PROPERTIES_BYTE = 0
# Reason codes handed to `on_publish` for a PUBACK without properties, shared: paho makes a new
# one (with its table of names) per PUBACK. Callbacks must not change them.
_PUBACK_REASONS = {code: ReasonCode(PacketTypes.PUBACK, identifier=code) for code in (0x00, 0x10)}
_PUBACK_PROPERTIES = Properties(PacketTypes.PUBACK)  # empty, shared in the same way
_MAKE_CONDITION = threading.Lock()


class LightInfo(paho.MQTTMessageInfo):
    """paho's MQTTMessageInfo, with its Condition made only once someone waits or asks.

    Safe without a lock on the publish side: `_set_as_published` sets `_published` before it
    looks for a Condition, and a waiter makes the Condition before it reads `_published`, so
    either the waiter sees it published or the publisher sees the Condition and notifies it."""

    __slots__ = ()

    def __init__(self, mid: int):  # noqa: D107 - paho's fields, without its Condition
        self.mid = mid
        self._published = False
        self._condition = None
        self.rc = MQTTErrorCode.MQTT_ERR_SUCCESS
        self._iterpos = 0

    def _set_as_published(self) -> None:
        self._published = True
        condition = self._condition
        if condition is not None:
            with condition:
                condition.notify_all()

    def _make_condition(self) -> None:
        with _MAKE_CONDITION:
            if self._condition is None:
                self._condition = threading.Condition()

    def wait_for_publish(self, timeout: Optional[float] = None) -> None:
        self._make_condition()
        super().wait_for_publish(timeout)

    def is_published(self) -> bool:
        self._make_condition()
        return super().is_published()


class Message(paho.MQTTMessage):
    """paho's MQTTMessage with a `LightInfo`; `properties` None unless the packet had some."""

    __slots__ = ()

    def __init__(self, mid: int = 0, topic: bytes = b""):  # noqa: D107 - paho's fields
        self.timestamp = 0.0
        self.state = paho.mqtt_ms_invalid
        self.dup = False
        self.mid = mid
        self._topic = topic
        self.payload = b""
        self.qos = 0
        self.retain = False
        self.info = LightInfo(mid)
        self.properties = None


class ReplyProperties:
    """The v5 properties of a publish the daemon makes, CorrelationData and ResponseTopic, packed
    by hand. paho reads a publish's properties only through `pack()` (and `str()` in its log)."""

    __slots__ = ("CorrelationData", "ResponseTopic", "_packed")

    def __init__(self, correlation_data: Optional[bytes] = None, response_topic: Optional[str] = None):
        self.CorrelationData = correlation_data  # noqa: N815 - paho's property names
        self.ResponseTopic = response_topic  # noqa: N815
        self._packed: Optional[bytes] = None

    def pack(self) -> bytes:
        if self._packed is None:
            body = b""
            if self.ResponseTopic is not None:
                body += bytes((_RESPONSE_TOPIC,)) + _str16(self.ResponseTopic.encode("utf-8"))
            if self.CorrelationData is not None:
                body += bytes((_CORRELATION_DATA,)) + _str16(bytes(self.CorrelationData))
            self._packed = varint(len(body)) + body
        return self._packed

    def __str__(self) -> str:
        return f"[CorrelationData : {self.CorrelationData!r}, ResponseTopic : {self.ResponseTopic!r}]"


def _str16(data: bytes) -> bytes:
    if len(data) > _STRING_MAX:
        raise ValueError("a v5 property is longer than 65,535 bytes")
    return _STR16.pack(len(data)) + data


def varint(value: int) -> bytes:
    """MQTT's variable byte integer (remaining lengths, property lengths)."""
    if value > _VARINT_MAX:
        raise ValueError("Packet too large")
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | 0x80 if value else byte)
        if not value:
            return bytes(out)


def plain_publish(header: int, body: bytes, v5: bool) -> Optional[tuple[bytes, int, bytes]]:
    """(topic, mid, payload) of a QoS 0 or 1 PUBLISH without v5 properties; None for anything
    else (properties, QoS 2, an empty topic, a short packet): paho's own decoder judges those."""
    qos = (header >> 1) & 0x03
    size = len(body)
    if qos > 1 or size < 2:
        return None
    topic_end = 2 + ((body[0] << 8) | body[1])
    if topic_end == 2:
        return None  # a v5 topic alias, or a 3.1.1 protocol error
    pos, mid = topic_end, 0
    if qos:
        if pos + 2 > size:
            return None
        mid = (body[pos] << 8) | body[pos + 1]
        pos += 2
    if v5:
        if pos >= size or body[pos] != _NO_PROPERTIES_BYTE:
            return None
        pos += 1
    if pos > size:
        return None
    return bytes(body[2:topic_end]), mid, bytes(body[pos:])


def puback_reason(body: bytes, v5: bool) -> Optional[ReasonCode]:
    """The shared reason code of a PUBACK without properties (success, or v5 "no matching
    subscribers"), or None: paho's decoder takes any other."""
    if len(body) == 2:
        return _PUBACK_REASONS[0x00]
    if v5 and (len(body) == 3 or (len(body) == 4 and body[3] == _NO_PROPERTIES_BYTE)):
        return _PUBACK_REASONS.get(body[2])
    return None


class Packets(paho.Client):
    """paho.Client that skips the per-packet objects its packets have no use for (module doc)."""

    def _paho_logs(self) -> bool:
        return self._logger is not None or self._on_log is not None

    def _handle_publish(self) -> MQTTErrorCode:
        header = self._in_packet["command"]
        found = None if self._paho_logs() else plain_publish(header, self._in_packet["packet"],
                                                               self._protocol == paho.MQTTv5)
        if found is None:
            return super()._handle_publish()
        topic, mid, payload = found
        message = Message(mid, topic)
        message.dup = bool(header & 0x08)
        message.qos = (header >> 1) & 0x03
        message.retain = bool(header & 0x01)
        message.payload = payload
        message.timestamp = paho.time_func()
        self._handle_on_message(message)
        if message.qos and not self._manual_ack:
            return self._send_puback(mid)
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    def _handle_pubackcomp(self, cmd: Any) -> MQTTErrorCode:
        body = self._in_packet["packet"]
        reason = None
        if cmd == "PUBACK" and not self._paho_logs():
            reason = puback_reason(body, self._protocol == paho.MQTTv5)
        if reason is None:
            return super()._handle_pubackcomp(cmd)
        mid = (body[0] << 8) | body[1]
        with self._out_message_mutex:
            if mid in self._out_messages:
                return self._do_on_publish(mid, reason, _PUBACK_PROPERTIES)
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    def ack(self, mid: int, qos: int) -> MQTTErrorCode:
        """paho's manual ack; a QoS 1 PUBACK is queued without paho's per-packet log call."""
        if qos != 1 or not self._manual_ack or self._paho_logs():
            return super().ack(mid, qos)
        return self._packet_queue(PUBACK, _PUBACK_PACKET.pack(PUBACK, 2, mid), mid, 1)

    def publish(self, topic: str, payload: paho.PayloadType = None, qos: int = 0, retain: bool = False,
                properties: Any = None) -> paho.MQTTMessageInfo:
        """paho's publish (the same checks, states and return codes), with a `Message`."""
        if self._protocol != paho.MQTTv5 and (topic is None or len(topic) == 0):
            raise ValueError("Invalid topic.")
        topic_bytes = topic.encode("utf-8")
        self._raise_for_invalid_topic(topic_bytes)
        if qos < 0 or qos > 2:
            raise ValueError("Invalid QoS level.")
        local_payload = paho._encode_payload(payload)
        if len(local_payload) > _MAX_PAYLOAD:
            raise ValueError("Payload too large.")
        mid = self._mid_generate()
        if qos == 0:
            info = LightInfo(mid)
            info.rc = self._send_publish(mid, topic_bytes, local_payload, qos, retain, False, info, properties)
            return info
        message = Message(mid, topic_bytes)
        message.timestamp = paho.time_func()
        message.payload = local_payload
        message.qos = qos
        message.retain = retain
        message.properties = properties
        return self._queue_publish(message)

    def _queue_publish(self, message: Message) -> paho.MQTTMessageInfo:
        """paho's publish for QoS > 0, from the out-messages lock on."""
        with self._out_message_mutex:
            if ((self._max_queued_messages > 0 and len(self._out_messages) >= self._max_queued_messages)
                    or message.mid in self._out_messages):
                message.info.rc = MQTTErrorCode.MQTT_ERR_QUEUE_SIZE
                return message.info
            self._out_messages[message.mid] = message
            if self._max_inflight_messages and self._inflight_messages >= self._max_inflight_messages:
                message.state = paho.mqtt_ms_queued
                return message.info
            self._inflight_messages += 1
            message.state = paho.mqtt_ms_wait_for_puback if message.qos == 1 else paho.mqtt_ms_wait_for_pubrec
            rc = self._send_publish(message.mid, message._topic, message.payload, message.qos, message.retain,
                                    message.dup, message.info, message.properties)
            if rc == MQTTErrorCode.MQTT_ERR_NO_CONN:  # sent after the connection is made
                self._inflight_messages -= 1
                message.state = paho.mqtt_ms_publish
            message.info.rc = rc
            return message.info
