"""paho_client's read-ahead: sized in requests of the size seen lately, within its bounds, byte-exact.

A stream of real PUBLISH packets goes through the client's own reader (`_packet_read`: framed
from the read-ahead where a packet lies whole in it, read by paho where one is cut at its end),
with the socket's recv() replaced by one that records what it is asked for.
"""

from __future__ import annotations

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from daemon.transport import paho_client
from daemon.transport.paho_packets import varint

TOPIC = b"t/x"


class _Socket:
    """The stream paho would read, and the size of every recv() asked of the socket."""

    def __init__(self, data: bytes):
        self.data, self.pos, self.asked = data, 0, []

    def recv(self, bufsize: int) -> bytes:
        if self.pos >= len(self.data):
            raise BlockingIOError("drained")
        self.asked.append(bufsize)
        chunk = self.data[self.pos : self.pos + bufsize]
        self.pos += len(chunk)
        return chunk


def _publish(i: int, body: int) -> tuple[bytes, bytes]:
    """A QoS 0 v5 PUBLISH whose body is `body` bytes, and its payload."""
    payload = bytes([i % 251]) * (body - 2 - len(TOPIC) - 1)
    packet_body = len(TOPIC).to_bytes(2, "big") + TOPIC + b"\x00" + payload  # no properties
    return b"\x30" + varint(len(packet_body)) + packet_body, payload


@pytest.mark.parametrize("body, n, expected", [
    (12_500, 1_500, paho_client.READ_AHEAD_PACKETS * 12_500),  # activity's requests: about 30 of them
    (3_400, 1_500, paho_client.READ_AHEAD_BYTES),  # gunpoint's: 30 would be 102 KB; the floor is above it
    (200, 6_000, paho_client.READ_AHEAD_BYTES),  # small sensor readings: the floor
    (100_000, 300, paho_client.READ_AHEAD_MAX_BYTES),  # large ones: the cap
])
def test_each_recv_asks_for_about_thirty_requests_of_the_size_seen_within_the_bounds(monkeypatch, body, n, expected):
    packets = [_publish(i, body) for i in range(n)]
    sock = _Socket(b"".join(packet for packet, _ in packets))
    monkeypatch.setattr(paho.Client, "_sock_recv", lambda self, bufsize: sock.recv(bufsize))
    client = paho_client.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    got: list[bytes] = []
    client.on_message = lambda c, userdata, message: got.append(message.payload)
    client._sock = object()  # "connected": the reader reads
    try:
        while len(got) < len(packets):
            client._packet_read()
    finally:
        client._sock = None
    assert got == [payload for _, payload in packets]  # what the read-ahead hands out is the stream
    settled = sock.asked[len(sock.asked) // 2 :]  # once the running mean has settled
    assert len(settled) >= 3
    assert all(abs(asked - expected) <= 0.05 * expected for asked in settled), (min(settled), max(settled))
