"""paho's per-packet objects, made only where a packet has something to put in them.

paho builds objects for every packet that most of the daemon's packets have no use for
(timeit per packet, paho 2.2.0, x86-64):
- a received v5 PUBLISH: `decode_publish` makes a `Properties` and unpacks it (17.6 µs;
  2.8 µs for a 3.1.1 one), though a request without properties carries a single 0 byte;
- a received PUBACK, the one per reply: a `ReasonCode` (its table of names, 3.2 µs) and an
  empty `Properties` (8.3 µs), in 3.1.1 too (14 µs per PUBACK).

`Packets` decodes a PUBLISH without properties (QoS 0 or 1) and a PUBACK without properties
itself and gives anything else to paho, unchanged. Its messages carry no `Properties` object
where the packet had none (`message.properties` is then None, also in v5). paho's debug log is
kept: with `enable_logger` or `on_log` set, every packet takes paho's own path.

These rely on paho 2.x internals (`_in_packet`, `_handle_publish`, `_handle_pubackcomp`,
`_do_on_publish`, `_out_messages`, `_handle_on_message`, `_packet_queue`), pinned by
`paho-mqtt>=2.1,<3`; tests/integration/test_paho_client.py checks them against the real paho.
"""

from __future__ import annotations

import struct
from typing import Any, Optional

import paho.mqtt.client as paho
from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

PUBLISH = 0x30
PUBACK = 0x40
_VARINT_MAX = 268_435_455
_PUBACK_PACKET = struct.Struct("!BBH")  # command, remaining length 2, mid
_NO_PROPERTIES_BYTE = 0
# Reason codes handed to `on_publish` for a PUBACK without properties, shared: paho makes a new
# one (with its table of names) per PUBACK. Callbacks must not change them.
_PUBACK_REASONS = {code: ReasonCode(PacketTypes.PUBACK, identifier=code) for code in (0x00, 0x10)}
_PUBACK_PROPERTIES = Properties(PacketTypes.PUBACK)  # empty, shared in the same way


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
        message = paho.MQTTMessage(mid, topic)
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
