"""paho's network thread, run over paho's public external-loop calls instead of `loop_start()`.

`loop_start()` runs `loop_forever`, which hides what the daemon needs to see and costs a system
call per publish, so this thread selects on paho's socket itself and calls paho's own
`reconnect()`, `loop_read()`, `loop_write()` and `loop_misc()` (paho's "external event loop"):
- **Why a connect failed.** `loop_forever` swallows the OSError of each failed attempt (the
  daemon names it: refused, DNS, TLS; link_health.py); here `reconnect()` raises it to us.
- **Where a read burst ends.** Each `loop_read()` takes what the socket holds (as many packets
  as paho has messages in flight); `after_pass` then hands that pass's requests to intake in
  one call.
- **One wake-up per batch of replies.** With its own loop thread (or `loop()`), paho writes a
  byte to a socketpair for every packet another thread queues: a system call per reply and per
  ack, and a wake-up of the network thread each. paho calls `on_socket_register_write` only
  when its write queue goes from empty to not empty; that hook writes the one wake-up byte
  here. It also keeps paho from writing on the publishing thread (which paho does when no
  loop thread of its own runs: two threads writing one socket could interleave packets).
- **Holding.** While `may_read()` is False (the daemon's byte budget is full: serve/admission.py)
  the socket is not read: replies and acks are still written and keepalive kept, and a QoS 1
  backlog waits at the broker instead of being answered `overloaded`. A read takes whatever
  the socket holds (paho ignores `loop_read`'s `max_packets`), so the link also holds inside
  a read, before handing on a message that finds the budget full (`hold`): writing, not
  reading, as paho itself writes from inside a read when a CONNACK comes. A hold lasts at most
  half the keepalive, then reading goes on (a PINGRESP unread for a whole keepalive would drop
  the connection; what is read past the budget then is admission's to shed, a reply each).
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
from typing import Callable

import paho.mqtt.client as paho
from paho.mqtt.enums import MQTTErrorCode

logger = logging.getLogger(__name__)

# How long one select() waits at most: paho's keepalive is checked at least this often.
PASS_TIMEOUT_S = 1.0
# While reading is held, how often the budget is asked again.
HELD_POLL_S = 0.005
_OK = MQTTErrorCode.MQTT_ERR_SUCCESS


class PahoLoop:
    """One thread: connect (again), read, write, keepalive; `after_pass` ends each read burst."""

    def __init__(self, client: paho.Client, after_pass: Callable[[], None], may_read: Callable[[], bool],
                 connect_failed: Callable[[Exception], None], retry_s: Callable[[], float], keepalive_s: float):
        """`connect_failed(error)` is told each failed attempt; `retry_s()` is the wait before the next
        attempt, after a failed one or a dropped connection."""
        self._client = client
        self._after_pass = after_pass
        self._may_read = may_read
        self._connect_failed = connect_failed
        self._retry_s = retry_s
        self._hold_max_s = keepalive_s / 2
        self._stop = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        for end in (self._wake_r, self._wake_w):
            end.setblocking(False)
        self._thread = threading.Thread(target=self._run, name="paho-loop", daemon=True)
        client.on_socket_register_write = self._wake

    def _wake(self, client: paho.Client, userdata: object, sock: object) -> None:
        """paho queued a packet on an empty write queue (on any thread): the network thread writes it."""
        try:
            self._wake_w.send(b"w")
        except (BlockingIOError, OSError):
            pass  # a wake-up is pending already, or the loop is closing

    def hold(self) -> None:
        """On the network thread, inside a read: while reading may not go on, write what is queued."""
        start = time.monotonic()
        while not self._may_read() and time.monotonic() - start < self._hold_max_s and not self._stop.is_set():
            self._client.loop_write()
            self._stop.wait(HELD_POLL_S)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float) -> None:
        """Ends the thread once what is queued is written (a DISCONNECT closes the socket)."""
        self._stop.set()
        self._wake(self._client, None, None)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if not self._connect():
                    continue
                try:
                    self._serve()
                except Exception:  # the network thread must survive anything a pass does
                    logger.exception("MQTT network loop failed; reconnecting")
                if not self._stop.is_set():
                    self._stop.wait(self._retry_s())
        finally:
            self._wake_r.close()
            self._wake_w.close()

    def _connect(self) -> bool:
        try:
            self._client.reconnect()
            return True
        except (OSError, ValueError) as exc:  # ValueError: paho's word for a host it cannot use
            self._connect_failed(exc)
            self._stop.wait(self._retry_s())
            return False

    def _serve(self) -> None:
        """Passes until the connection drops, or until stopped with nothing left to write."""
        rc, read_at = _OK, time.monotonic()
        while rc == _OK:
            sock = self._client.socket()
            if sock is None or (self._stop.is_set() and not self._client.want_write()):
                return
            reading = self._may_read() or time.monotonic() - read_at >= self._hold_max_s
            pending = reading and getattr(sock, "pending", lambda: 0)()  # TLS bytes select() cannot see
            readable, _, _ = select.select([sock, self._wake_r] if reading else [self._wake_r],
                                           [sock] if self._client.want_write() else [], [],
                                           0 if pending else PASS_TIMEOUT_S if reading else HELD_POLL_S)
            if self._wake_r in readable:
                self._drain_wake()
            if reading and (pending or sock in readable):
                rc = self._client.loop_read()
                read_at = time.monotonic()
                self._after_pass()
            if rc == _OK and self._client.want_write():
                rc = self._client.loop_write()
            if rc == _OK:
                rc = self._client.loop_misc()

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass
