"""The native link's wire: a TCP (or TLS) socket to the broker, CONNECT/CONNACK, and framing.

The `mqtt5` package (a Rust codec, sans-IO) encodes and decodes whole MQTT v5 packets; it
does no I/O, so this module owns the socket. It is MQTT v5 only: `mqtt.transport: native`
with `protocol: 3.1.1` is refused at config check (daemon/config/mqtt.py).

- The socket gets TCP_NODELAY before anything is sent (see mqtt.py's module doc: replies
  waited ~40 ms for delayed ACKs with Nagle on).
- TLS is the standard library's `ssl`: a default context (CERT_REQUIRED, hostname checked
  against `mqtt.broker`'s host, IP addresses included), `ca_file` or the system's trust store,
  and the client certificate when `cert_file`/`key_file` are set.
- The connect and its CONNACK are blocking, with a time limit; the link's loop then turns
  the socket non-blocking (native.py), because a blocking write while the broker is itself
  blocked writing to us would deadlock both.
"""

from __future__ import annotations

import socket
import ssl
from typing import Optional

import mqtt5

from daemon.config.mqtt import MqttConfig

# Time allowed for the TCP connect, the TLS handshake and the CONNACK.
CONNECT_TIMEOUT_S = 10.0
# One recv() reads up to this much: many requests' worth of packets.
READ_BYTES = 1 << 16
# MQTT v5 caps ReceiveMaximum at 65,535 (a two-byte integer).
MAX_RECEIVE_MAXIMUM = 0xFFFF
# A non-blocking socket (plain or TLS) has nothing to give or no room to take: try again later.
WOULD_BLOCK = (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError, InterruptedError)


class ProtocolError(Exception):
    """The broker sent bytes that are not MQTT v5 (or not what this client expects)."""


def tls_context(config: MqttConfig) -> Optional[ssl.SSLContext]:
    """The client's TLS context, or None for plain TCP."""
    tls = config.tls
    if tls is None:
        return None
    context = ssl.create_default_context(cafile=None if tls.ca_file is None else str(tls.ca_file))
    if tls.cert_file is not None:
        context.load_cert_chain(str(tls.cert_file), None if tls.key_file is None else str(tls.key_file))
    return context


def open_socket(config: MqttConfig, context: Optional[ssl.SSLContext]) -> socket.socket:
    """A connected socket (TLS handshake done), blocking with CONNECT_TIMEOUT_S. Raises OSError
    (ssl.SSLError included) with the cause; link_health.connect_cause words it."""
    sock = socket.create_connection((config.host, config.port), timeout=CONNECT_TIMEOUT_S)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if context is not None:
            sock = context.wrap_socket(sock, server_hostname=config.host)
    except BaseException:
        sock.close()
        raise
    return sock


def connect_packet(config: MqttConfig, receive_maximum: Optional[int], will: mqtt5.Will) -> bytes:
    """CONNECT: persistent session or clean start, ReceiveMaximum, keepalive, credentials, LWT."""
    password = None if config.password is None else config.password.encode("utf-8")
    return mqtt5.ConnectPacket(
        config.client_id, username=config.username, password=password, clean_start=not config.persistent,
        will=will, keep_alive=config.keepalive_s,
        session_expiry_interval=config.session_expiry_s if config.persistent else 0,
        receive_max=min(receive_maximum or MAX_RECEIVE_MAXIMUM, MAX_RECEIVE_MAXIMUM)).write()


def reason_text(code: object) -> str:
    """An mqtt5 reason code enum as words: SESSION_TAKEN_OVER -> "session taken over"."""
    name = getattr(code, "name", None)
    return name.replace("_", " ").lower() if name else str(code)


class Frames:
    """Bytes in, whole packets out; a packet split across reads waits for its rest."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def clear(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list:
        """The complete packets in what has arrived so far, in order. Raises ProtocolError."""
        buf = self._buf
        buf += data
        packets, pos, end = [], 0, len(buf)
        with memoryview(buf) as view:
            while pos < end:
                try:
                    packet, size = mqtt5.read(view[pos:])
                except IndexError:  # mqtt5: "Not enough bytes": the rest is still on its way
                    break
                except ValueError as exc:
                    raise ProtocolError(f"malformed packet from the broker: {exc}") from exc
                packets.append(packet)
                pos += size
        if pos:
            del buf[:pos]
        return packets


def read_connack(sock: socket.socket, frames: Frames) -> tuple[mqtt5.ConnAckPacket, list]:
    """Block (CONNECT_TIMEOUT_S) for the CONNACK; returns it and the packets that came after it
    in the same reads (a resumed session's redeliveries follow the CONNACK at once)."""
    while True:
        data = sock.recv(READ_BYTES)
        if not data:
            raise ConnectionResetError("the broker closed the connection before its CONNACK")
        packets = frames.feed(data)
        if packets:
            first, rest = packets[0], packets[1:]
            if not isinstance(first, mqtt5.ConnAckPacket):
                raise ProtocolError(f"expected CONNACK, got {type(first).__name__}")
            return first, rest
