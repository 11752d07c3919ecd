"""How other threads get the native link's network thread to write: a socketpair, woken sparingly.

A worker queues its packets on the link's output list and then wakes the network thread by
writing one byte to a socketpair it selects on. Three rules keep that to about one system
call per batch of replies:
- inside `batch()` a thread only notes that it owes a wake-up, and pays it once at the end;
- the network thread never wakes itself: it writes at the end of the burst it is handling;
- while a wake-up is pending (sent, not yet seen) no second byte is written.
The network thread drains the socketpair and only then clears the pending flag, before it
takes the output list: a byte written after the drain stays for the next select(), and a
wake-up skipped because the flag was still set finds its packets in the list it takes.
"""

from __future__ import annotations

import socket
import threading
from contextlib import contextmanager
from typing import Iterator, Optional

from daemon.transport.native_wire import WOULD_BLOCK

_WAKE_BYTE = b"\0"
_DRAIN_BYTES = 4096


class Wakeup:
    """The socketpair and its rules; `reader` is what the network thread selects on."""

    def __init__(self) -> None:
        self.reader, self._writer = socket.socketpair()
        self.reader.setblocking(False)
        self._writer.setblocking(False)
        self._pending = False
        self._held = threading.local()
        self.loop_ident: Optional[int] = None  # the network thread, once it runs

    def kick(self) -> None:
        """Something was queued for the network thread to write."""
        if threading.get_ident() == self.loop_ident:
            return
        if getattr(self._held, "depth", 0):
            self._held.owed = True
            return
        self.wake()

    def wake(self) -> None:
        if not self._pending:
            self._pending = True
            try:
                self._writer.send(_WAKE_BYTE)
            except OSError:
                pass  # full (the loop is awake already) or closing

    def drained(self) -> None:
        """The network thread, woken: drain, then clear the flag (the module doc says why)."""
        try:
            while self.reader.recv(_DRAIN_BYTES):
                pass
        except WOULD_BLOCK:
            pass
        self._pending = False

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Packets queued by this thread inside the block wake the network thread once, at the end."""
        held = self._held
        if getattr(held, "depth", 0):
            yield
            return
        held.depth, held.owed = 1, False
        try:
            yield
        finally:
            held.depth = 0
            if held.owed:
                self.wake()

    def close(self) -> None:
        self.reader.close()
        self._writer.close()
