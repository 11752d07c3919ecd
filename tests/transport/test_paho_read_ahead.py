"""paho_client's read-ahead: sized in packets of the size seen lately, within its bounds, byte-exact."""

from __future__ import annotations

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from daemon.transport import paho_client


class _Socket:
    """The stream paho would read, and the size of every recv() asked of the socket."""

    def __init__(self, data: bytes):
        self.data, self.pos, self.asked = data, 0, []

    def recv(self, bufsize: int) -> bytes:
        self.asked.append(bufsize)
        chunk = self.data[self.pos : self.pos + bufsize]
        self.pos += len(chunk)
        return chunk


def _packets(n: int, body: int) -> list[bytes]:
    return [bytes([0x32, i % 256]) + bytes([i % 251]) * (body - 2) for i in range(n)]


def _read_as_paho_does(client: paho_client.Client, bodies: list[bytes]) -> list[bytes]:
    """A fixed-header byte, a remaining-length byte, then the body (in as many reads as it takes)."""
    got = []
    for body in bodies:
        client._sock_recv(1)
        client._sock_recv(1)
        parts, left = [], len(body)
        while left:
            part = client._sock_recv(left)
            parts.append(part)
            left -= len(part)
        got.append(b"".join(parts))
    return got


@pytest.mark.parametrize("body, expected", [
    (12_500, paho_client.READ_AHEAD_PACKETS * 12_500),  # activity's requests: about 40 of them
    (3_400, paho_client.READ_AHEAD_BYTES),  # gunpoint's: 40 would be 136 KB; the floor is near it
    (200, paho_client.READ_AHEAD_BYTES),  # small sensor readings: the floor
    (100_000, paho_client.READ_AHEAD_MAX_BYTES),  # large ones: the cap
])
def test_each_recv_asks_for_about_forty_packets_of_the_size_seen_within_the_bounds(monkeypatch, body, expected):
    bodies = _packets(2_000, body)
    sock = _Socket(b"".join(b"\x32\x00" + b for b in bodies))
    monkeypatch.setattr(paho.Client, "_sock_recv", sock.recv)
    client = paho_client.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    assert _read_as_paho_does(client, bodies) == bodies  # what the read-ahead hands out is the stream
    settled = sock.asked[len(sock.asked) // 2 :]  # once the running mean has settled
    assert all(abs(asked - expected) <= 0.05 * expected for asked in settled), (min(settled), max(settled))
