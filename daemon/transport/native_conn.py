"""One live connection of the native link: a non-blocking socket, its selector, keepalive.

Owned by the link's network thread alone: every read and write of the socket happens
there (an SSL object must not be read and written from two threads at once), and other
threads reach it only through the link's output list and its wake-up socketpair.

Keepalive as paho does it (`_check_keepalive`): once nothing has gone out, or nothing has
come in, for `keepalive_s`, a PINGREQ goes out; if no PINGRESP is back `keepalive_s` after
it, the link is dead (a half-open TCP connection, a frozen broker) and is dropped, so the
reconnect starts instead of waiting for the kernel's TCP timeout (minutes).

Reading can be held (`wait(reads=False)`: the daemon's byte budget is full): the socket is
then not watched for reads, so the broker's packets wait in the kernel and at the broker,
and the loop looks again every `HELD_POLL_S`. An unanswered PINGREQ is read for even then.
"""

from __future__ import annotations

import selectors
import socket
import ssl
import time
from typing import Callable, Optional

import mqtt5

from daemon.transport.native_wire import READ_BYTES, WOULD_BLOCK, Frames

# Bytes read in one burst at most before the loop writes (acks and replies keep flowing).
BURST_BYTES = 1 << 18
# Time allowed to get the last bytes and the DISCONNECT out on a clean stop.
GOODBYE_TIMEOUT_S = 2.0
PINGREQ = mqtt5.PingReqPacket().write()
# While reading is held, how often the loop asks again whether it may read.
HELD_POLL_S = 0.005
# While publishes wait for their PUBACKs and the broker has sent nothing for this long, a PINGREQ
# goes out (nudge()): mosquitto 2.0.11 under overload held a client's PUBACKs in its output queue
# until that client wrote again (docs/reliability.md, "A broker that goes quiet").
NUDGE_S = 0.1
_SOCKET, _WAKE = "socket", "wake"


class Dead(Exception):
    """The connection is gone: `code` is a v5 DISCONNECT reason code (or UNSPECIFIED), `reason` words."""

    UNSPECIFIED = 0x80

    def __init__(self, reason: str, code: int = UNSPECIFIED):
        super().__init__(reason)
        self.reason, self.code = reason, code


class Connection:
    """A connected socket past its CONNACK, driven by the network thread."""

    def __init__(self, sock: socket.socket, frames: Frames, wake: socket.socket, keepalive_s: float,
                 clock: Callable[[], float] = time.monotonic):
        sock.setblocking(False)
        self._sock, self._frames, self._wake, self._clock = sock, frames, wake, clock
        self._keepalive_s = keepalive_s
        self._selector = selectors.DefaultSelector()
        self._selector.register(sock, selectors.EVENT_READ, _SOCKET)
        self._selector.register(wake, selectors.EVENT_READ, _WAKE)
        self._unsent = bytearray()
        self._want_write = False
        self._reading = True  # the socket is watched for reads (not held)
        self.last_in = self.last_out = clock()
        self._ping_at: Optional[float] = None
        self.nudges = 0  # PINGREQs sent by nudge()
        self._nudged_at = 0.0

    def wait(self, reads: bool = True, until: Optional[float] = None) -> tuple[bool, bool]:
        """Until the socket is readable (when `reads`, or a PINGREQ is unanswered), writable (when
        bytes wait), woken, keepalive is due, or the clock reaches `until`: (readable, woken)."""
        reads = reads or self._ping_at is not None
        if reads != self._reading:
            self._reading = reads
            self._watch()
        timeout = max(0.0, min(self._next_check(), until if until is not None else float("inf")) - self._clock())
        if not reads:
            timeout = min(timeout, HELD_POLL_S)
        readable = woken = False
        for key, events in self._selector.select(timeout):
            if key.data == _WAKE:
                woken = True
            elif events & selectors.EVENT_READ:
                readable = True
        if reads and isinstance(self._sock, ssl.SSLSocket) and self._sock.pending():
            readable = True  # decrypted bytes select() cannot see
        return readable, woken

    def read(self) -> list:
        """The packets of one read burst (PINGRESP taken here). Raises Dead or ProtocolError."""
        chunks: list[bytes] = []
        got = 0
        while got < BURST_BYTES:
            try:
                data = self._sock.recv(READ_BYTES)
            except WOULD_BLOCK:
                break
            except OSError as exc:
                raise Dead(f"read failed: {exc}") from exc
            if not data:
                raise Dead("the broker closed the connection")
            chunks.append(data)
            got += len(data)
            if len(data) < READ_BYTES and not (isinstance(self._sock, ssl.SSLSocket) and self._sock.pending()):
                break  # the socket is drained: no extra recv() just to hear EAGAIN
        if not got:
            return []
        self.last_in = self._clock()
        packets = self._frames.feed(chunks[0] if len(chunks) == 1 else b"".join(chunks))
        return [p for p in packets if not self._is_pong(p)]

    def send(self, data: bytes) -> None:
        """Queue `data` after what is still unsent and write as much as the socket takes."""
        if data:
            self._unsent += data
        if not self._unsent:
            return
        try:
            sent = self._sock.send(self._unsent)
        except WOULD_BLOCK:
            sent = 0
        except OSError as exc:
            raise Dead(f"write failed: {exc}") from exc
        if sent:
            del self._unsent[:sent]
            self.last_out = self._clock()
        self._watch_writes(bool(self._unsent))

    def keepalive(self) -> Optional[bytes]:
        """PINGREQ when one is due; raises Dead when the last one went unanswered."""
        now = self._clock()
        if self._ping_at is not None:
            if now - self._ping_at >= self._keepalive_s:
                raise Dead(f"keepalive: no PINGRESP within {self._keepalive_s:g} s")
            return None
        if now - self.last_out >= self._keepalive_s or now - self.last_in >= self._keepalive_s:
            self._ping_at = now
            return PINGREQ
        return None

    def nudge_due(self) -> float:
        """When nudge() would send, if nothing comes in before."""
        return max(self.last_in, self._nudged_at) + NUDGE_S

    def nudge(self) -> Optional[bytes]:
        """PINGREQ when the broker has been silent for NUDGE_S (the caller waits on it), at most once
        per NUDGE_S. Unlike keepalive()'s it is not read for: while reading is held, reading for its
        PINGRESP would read the requests before it, past the byte budget; the keepalive still
        judges whether the broker is alive."""
        now = self._clock()
        if now < self.nudge_due():
            return None
        self._nudged_at = now
        self.nudges += 1
        return PINGREQ

    def goodbye(self, disconnect: bytes) -> None:
        """A clean stop: what is unsent, then DISCONNECT (no LWT), blocking for a moment."""
        try:
            self._sock.settimeout(GOODBYE_TIMEOUT_S)
            self._sock.sendall(bytes(self._unsent) + disconnect)
        except OSError:
            pass  # the broker is gone already; the LWT (offline) covers it

    def close(self) -> None:
        self._selector.close()
        try:
            self._sock.close()
        except OSError:
            pass

    def _next_check(self) -> float:
        if self._ping_at is not None:
            return self._ping_at + self._keepalive_s
        return min(self.last_out, self.last_in) + self._keepalive_s

    def _is_pong(self, packet: object) -> bool:
        if isinstance(packet, mqtt5.PingRespPacket):
            self._ping_at = None  # a nudge's PINGRESP answers an outstanding keepalive PINGREQ as well
            return True
        return False

    def _watch_writes(self, want: bool) -> None:
        if want != self._want_write:
            self._want_write = want
            self._watch()

    def _watch(self) -> None:
        """Watch the socket for what is wanted now: reads unless held, writes while bytes wait."""
        events = (selectors.EVENT_READ if self._reading else 0) | (selectors.EVENT_WRITE if self._want_write else 0)
        registered = self._sock in self._selector.get_map()
        if not events:
            if registered:
                self._selector.unregister(self._sock)
        elif registered:
            self._selector.modify(self._sock, events, _SOCKET)
        else:
            self._selector.register(self._sock, events, _SOCKET)
