"""paho_packets' shortcuts agree with paho's own encoder and decoder, packet for packet."""

from __future__ import annotations

import struct

import paho.mqtt.client as paho
from hypothesis import given, settings
from hypothesis import strategies as st
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from daemon.transport import paho_packets
from daemon.transport.paho_packets import LightInfo, ReplyProperties, plain_publish, puback_reason, varint


class _Captured(paho.Client):
    """A paho client whose packets are kept instead of sent."""

    def __init__(self, protocol: int):
        super().__init__(CallbackAPIVersion.VERSION2, protocol=protocol)
        self.packets: list[bytes] = []
        self._sock = object()  # "connected": _send_publish builds the packet

    def _packet_queue(self, command, packet, mid, qos, info=None):
        self.packets.append(bytes(packet))
        return paho.MQTT_ERR_SUCCESS

    def _reset_sockets(self, sockpair_only: bool = False) -> None:
        self._sock = None


def _split(packet: bytes) -> tuple[int, bytes]:
    """A packet's first byte and its body (after the remaining length)."""
    pos = 1
    while packet[pos] & 0x80:
        pos += 1
    return packet[0], packet[pos + 1 :]


def _paho_publish(protocol: int, topic: bytes, payload: bytes, qos: int, properties) -> tuple[int, bytes]:
    client = _Captured(protocol)
    client._send_publish(7 if qos else 0, topic, payload, qos, False, False, None, properties)
    return _split(client.packets[0])


def _paho_decode(protocol: int, header: int, body: bytes) -> paho.MQTTMessage:
    """The message paho's own `_handle_publish` makes of a packet."""
    client = paho.Client(CallbackAPIVersion.VERSION2, protocol=protocol, manual_ack=True)
    got: list[paho.MQTTMessage] = []
    client.on_message = lambda c, userdata, message: got.append(message)
    client._in_packet = {"command": header, "have_remaining": 1, "remaining_count": [], "remaining_mult": 1,
                         "remaining_length": len(body), "packet": bytearray(body), "to_process": 0, "pos": 0}
    paho.Client._handle_publish(client)
    return got[0]


topics = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="+#\0"), min_size=1,
                 max_size=40).map(lambda t: t.encode())


@settings(max_examples=200, deadline=None)
@given(topic=topics, payload=st.binary(max_size=300), qos=st.sampled_from([0, 1]),
       v5=st.booleans(), correlation=st.one_of(st.none(), st.binary(max_size=20)))
def test_a_publish_decodes_as_paho_decodes_it_or_goes_to_paho(topic, payload, qos, v5, correlation):
    properties = None
    if v5 and correlation is not None:
        properties = Properties(PacketTypes.PUBLISH)
        properties.CorrelationData = correlation
    protocol = paho.MQTTv5 if v5 else paho.MQTTv311
    header, body = _paho_publish(protocol, topic, payload, qos, properties)
    expected = _paho_decode(protocol, header, body)
    found = plain_publish(header, body, v5)
    if properties is not None:
        assert found is None  # a packet with properties is paho's to decode
    else:
        assert found == (expected._topic, expected.mid, bytes(expected.payload))


def test_qos_2_an_empty_topic_and_a_cut_packet_are_left_to_paho():
    header, body = _paho_publish(paho.MQTTv5, b"a/b", b"x", 2, None)
    assert plain_publish(header, body, True) is None
    assert plain_publish(0x32, struct.pack("!H", 0) + b"\x00\x07\x00x", True) is None  # a topic alias
    header, body = _paho_publish(paho.MQTTv5, b"a/b", b"", 1, None)
    assert plain_publish(header, body[:-1], True) is None  # no room for the property length


def test_puback_reasons_are_paho_s_for_packets_without_properties():
    assert puback_reason(b"\x00\x05", v5=False).value == 0
    assert puback_reason(b"\x00\x05", v5=True).value == 0
    assert puback_reason(b"\x00\x05\x10", v5=True).getName() == "No matching subscribers"
    assert puback_reason(b"\x00\x05\x10\x00", v5=True).value == 0x10
    assert puback_reason(b"\x00\x05\x87", v5=True) is None  # "Not authorized": paho's own decoder
    assert puback_reason(b"\x00\x05\x00\x03\x1f\x00\x00", v5=True) is None  # a reason string
    assert puback_reason(b"\x00\x05\x00", v5=False) is None  # malformed in 3.1.1


@settings(max_examples=100, deadline=None)
@given(correlation=st.one_of(st.none(), st.binary(max_size=300)),
       response=st.one_of(st.none(), st.text(max_size=40).filter(lambda t: "\0" not in t)))
def test_reply_properties_pack_as_paho_s_properties(correlation, response):
    theirs = Properties(PacketTypes.PUBLISH)
    if correlation is not None:
        theirs.CorrelationData = correlation
    if response is not None:
        theirs.ResponseTopic = response
    ours = ReplyProperties(correlation, response).pack()
    unpacked = Properties(PacketTypes.PUBLISH)
    unpacked.unpack(ours)
    assert unpacked.json() == theirs.json()
    assert len(ours) == len(theirs.pack())


def test_varint_is_mqtt_s_remaining_length():
    client = paho.Client(CallbackAPIVersion.VERSION2)
    for value in (0, 1, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152, 268_435_455):
        assert varint(value) == bytes(client._pack_remaining_length(bytearray(), value))


def test_light_info_has_no_condition_until_someone_waits():
    info = LightInfo(3)
    info._set_as_published()
    assert info._condition is None and info._published
    info.wait_for_publish(0.01)  # published already: returns at once
    assert info.is_published()
    waiting = LightInfo(4)
    assert not waiting.is_published() and waiting._condition is not None


def test_shared_puback_reason_codes_are_paho_s():
    for code, reason in paho_packets._PUBACK_REASONS.items():
        assert reason.value == code and reason.packetType == PacketTypes.PUBACK
