"""A TCP relay between the daemon and a real broker that plays a broker dropping the connection.

It forwards bytes both ways and reads the client-to-broker stream as MQTT packets (fixed
header, remaining length). The first PUBLISH on a topic under `cut_prefix` is not forwarded:
the relay closes both sides instead, so the client has handed that publish on and will never
see its PUBACK. From then on it accepts connections and closes them at once (a broker that is
unreachable), until `heal()`.
"""

from __future__ import annotations

import socket
import threading
from typing import Optional

from daemon.tools.broker import free_port

_LOOPBACK = "127.0.0.1"
_PUBLISH = 3
_CHUNK = 65536


def _packet_length(buf: bytes) -> Optional[tuple[int, int]]:
    """(header length, remaining length) of the packet at the start of `buf`, None if incomplete."""
    multiplier, value = 1, 0
    for i in range(1, min(len(buf), 5)):
        value += (buf[i] & 0x7F) * multiplier
        if not buf[i] & 0x80:
            return i + 1, value
        multiplier *= 128
    return None


def _publish_topic(packet: bytes, header: int) -> Optional[str]:
    if packet[0] >> 4 != _PUBLISH:
        return None
    size = int.from_bytes(packet[header:header + 2], "big")
    return packet[header + 2:header + 2 + size].decode(errors="replace")


class CuttingProxy:
    """`with CuttingProxy(broker.port, "results/") as proxy:` ... `proxy.address`, `proxy.cut.wait()`."""

    def __init__(self, upstream_port: int, cut_prefix: str):
        self.upstream_port = upstream_port
        self.cut_prefix = cut_prefix
        self.port = free_port()
        self.cut = threading.Event()  # set once a PUBLISH under cut_prefix was swallowed
        self.swallowed: list[str] = []
        self._healed = threading.Event()
        self._listener = socket.create_server((_LOOPBACK, self.port))
        self._threads: list[threading.Thread] = []
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()

    @property
    def address(self) -> str:
        return f"{_LOOPBACK}:{self.port}"

    def heal(self) -> None:
        """Forward everything from now on (new connections only)."""
        self._healed.set()

    def _spawn(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            if self.cut.is_set() and not self._healed.is_set():
                client.close()  # unreachable: the client retries
                continue
            upstream = socket.create_connection((_LOOPBACK, self.upstream_port))
            with self._lock:
                self._open += [client, upstream]
            self._spawn(self._pump_down, upstream, client)
            self._spawn(self._pump_up, client, upstream)

    def _pump_down(self, upstream: socket.socket, client: socket.socket) -> None:
        """Broker to client: as is."""
        try:
            while data := upstream.recv(_CHUNK):
                client.sendall(data)
        except OSError:
            pass
        self._close(upstream, client)

    def _pump_up(self, client: socket.socket, upstream: socket.socket) -> None:
        """Client to broker, packet by packet; the first publish under cut_prefix ends the connection."""
        buf = b""
        try:
            while data := client.recv(_CHUNK):
                buf += data
                while (found := _packet_length(buf)) is not None and len(buf) >= sum(found):
                    header, remaining = found
                    packet, buf = buf[:header + remaining], buf[header + remaining:]
                    topic = _publish_topic(packet, header)
                    if topic is not None and topic.startswith(self.cut_prefix) and not self._healed.is_set():
                        self.swallowed.append(topic)
                        self.cut.set()
                        self._close(client, upstream)
                        return
                    upstream.sendall(packet)
        except OSError:
            pass
        self._close(client, upstream)

    @staticmethod
    def _close(*socks: socket.socket) -> None:
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def __enter__(self) -> "CuttingProxy":
        self._spawn(self._accept_loop)
        return self

    def __exit__(self, *exc: object) -> None:
        # close() alone does not wake the thread blocked in accept() on Linux (its join waited
        # out the whole 5 s at every exit); shutdown() does.
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        with self._lock:
            self._close(*self._open)
        for thread in self._threads:
            thread.join(5)
