"""A request's bytes in, within its time: the deadline every read of a connection runs against,
the body by its Content-Length (inflated when its Content-Encoding is gzip or deflate), and a
refused body read and dropped so that its answer reaches the client.

- **One deadline per request, not per read.** A socket timeout bounds each `recv`, so a client
  sending a header byte every few seconds held its connection (and one of `max_connections`)
  for ever; `DeadlineReader` gives every read the time left to the request instead.
- **A refused body is read before the connection closes.** Closing a socket with unread bytes
  makes the kernel answer the client's next segment with a reset: a client that writes its whole
  body before it reads (http.client, tritonclient, requests) then fails its write
  (BrokenPipeError) and, over TLS, loses the answer with it (SSLEOFError), so it never sees the
  401 or 413 it was sent. Half-closing and lingering would not help that client either: its
  writes must still be read. So the answer leaves first and the body is read and dropped, up to
  `DISCARD_MAX_BYTES` and within the request's deadline; only past those is it reset.
- **Compressed bodies** (tritonclient's `request_compression_algorithm`) are inflated, and the
  size bound holds on both sides: the bytes sent (Content-Length) and the bytes inflated, so a
  decompression bomb is refused 413 once it passes the bound, without inflating the rest.
"""

from __future__ import annotations

import io
import math
import socket
import time
import zlib
from email.message import Message
from typing import Optional

from daemon.transport import v2_codec

READ_CHUNK = 1 << 16
# A refused body is read and dropped up to this many bytes (past it the connection is reset):
# enough for a picture or a batch several times max_body_bytes' default, and read at the
# network's speed within the request's deadline, on the refused client's own thread.
DISCARD_MAX_BYTES = 32 << 20
TOO_LARGE = "too_large"
# Content-Encoding -> zlib's wbits: gzip's header and trailer, deflate's zlib wrapper (RFC 9110
# 8.4.1.2: "deflate" is the zlib format, as tritonclient sends it).
WBITS = {"gzip": 31, "x-gzip": 31, "deflate": 15}
IDENTITY = "identity"


class Refused(Exception):
    """The body cannot be taken: status, code and message; `close` when it was left unread."""

    def __init__(self, status: int, code: str, message: str, close: bool = False):
        super().__init__(message)
        self.status, self.code, self.close = status, code, close


class DeadlineReader(io.RawIOBase):
    """A connection's bytes in, every read bounded by one deadline (`deadline`, monotonic seconds):
    past it a read raises TimeoutError, as a socket timeout does. `got` counts the bytes read
    since `start` set the deadline: whether a request had begun when its time ran out."""

    def __init__(self, sock: socket.socket):
        super().__init__()
        self._sock = sock
        self.deadline = math.inf
        self.got = 0

    def start(self, seconds: float) -> float:
        """A new deadline `seconds` from now; returns the time it counts from."""
        now = time.monotonic()
        self.deadline, self.got = now + seconds, 0
        return now

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("past the request's deadline")
        self._sock.settimeout(left)
        n = self._sock.recv_into(buffer)
        self.got += n
        return n


def expected_length(headers: Message, limit: int) -> tuple[int, Optional[int]]:
    """The body's length by its Content-Length and its zlib wbits (None: not compressed), or
    Refused before a byte of it is read (411, 413, 415: the body is left unread)."""
    if headers.get("Transfer-Encoding"):
        raise Refused(411, v2_codec.BAD_REQUEST, "send a Content-Length (chunked bodies are not taken)", True)
    try:
        length = int(headers.get("Content-Length", ""))
    except ValueError:
        raise Refused(411, v2_codec.BAD_REQUEST, "a Content-Length is required", close=True) from None
    if length < 0:
        raise Refused(400, v2_codec.BAD_REQUEST, "a negative Content-Length", close=True)
    if length > limit:
        raise Refused(413, TOO_LARGE, f"the body has {length} bytes; http.max_body_bytes is {limit}", True)
    encoding = (headers.get("Content-Encoding") or IDENTITY).strip().lower()
    if encoding != IDENTITY and encoding not in WBITS:
        raise Refused(415, v2_codec.BAD_REQUEST, f"Content-Encoding {encoding!r} is not taken: send gzip, "
                      "deflate or an uncompressed body", close=True)
    return length, WBITS.get(encoding)


def read_exactly(rfile: io.BufferedReader, length: int, timeout_ms: float) -> bytes:
    """`length` bytes, before the reader's deadline (else Refused 408)."""
    chunks, got = [], 0
    try:
        while got < length:
            chunk = rfile.read1(min(length - got, READ_CHUNK))
            if not chunk:
                raise ConnectionError("the client closed the connection mid-body")
            chunks.append(chunk)
            got += len(chunk)
    except TimeoutError:  # socket.timeout is TimeoutError since Python 3.10
        raise Refused(408, "timeout", f"the body did not arrive within http.request_timeout_ms "
                      f"({timeout_ms:g})", close=True) from None
    return b"".join(chunks)


def inflate(body: bytes, wbits: Optional[int], limit: int) -> bytes:
    """The body as sent before compression, at most `limit` bytes (else Refused 413: never more
    than limit + 1 bytes are inflated); as is when `wbits` is None."""
    if wbits is None:
        return body
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise Refused(400, v2_codec.BAD_REQUEST, f"the compressed body cannot be inflated: {exc}") from None
    if len(out) > limit:
        raise Refused(413, TOO_LARGE, f"the body inflates past http.max_body_bytes ({limit} bytes)")
    if not inflater.eof or inflater.unused_data:
        raise Refused(400, v2_codec.BAD_REQUEST, "the compressed body is truncated or has bytes after its end")
    return out


def discard(rfile: io.BufferedReader, length: int) -> bool:
    """Read and drop `length` bytes before the reader's deadline; False when they did not all come
    (or there were too many to read: past DISCARD_MAX_BYTES nothing is read)."""
    if length > DISCARD_MAX_BYTES:
        return False
    try:
        while length > 0:
            chunk = rfile.read1(min(length, READ_CHUNK))
            if not chunk:
                return False
            length -= len(chunk)
    except OSError:  # TimeoutError included: the deadline passed, or the client went away
        return False
    return True
