"""paho's network thread, run over paho's public external-loop calls instead of `loop_start()`.

`loop_start()` runs `loop_forever`, which hides three things the daemon needs to see, so this
thread calls paho's own `reconnect()`, `loop()`, `loop_write()` and `loop_misc()` itself:
- **Why a connect failed.** `loop_forever` swallows the OSError of each failed attempt (the
  daemon names it: refused, DNS, TLS; link_health.py); here `reconnect()` raises it to us.
- **Where a read burst ends.** Each `loop()` pass reads what the socket holds (paho's
  `loop_read` takes as many packets as it has messages in flight); `after_pass` then hands
  that pass's requests to intake in one call.
- **Holding.** While `may_read()` is False (the daemon's byte budget is full: serve/admission.py)
  no pass reads: replies and acks are still written (`loop_write`) and keepalive kept
  (`loop_misc`), and a QoS 1 backlog waits at the broker instead of being answered
  `overloaded`. A pass reads whatever the socket holds (paho ignores `loop_read`'s
  `max_packets`), so the link also holds inside a pass, before handing on a message that
  finds the budget full (`hold`): writing, not reading, as paho itself writes from inside a
  read when a CONNACK comes. A hold lasts at most half the keepalive, then reading goes on
  (a PINGRESP unread for a whole keepalive would drop the connection; what is read past the
  budget then is admission's to shed, with a reply each).

paho writes a publish made on another thread itself, on that thread, when no loop thread of its
own runs (`_packet_queue`); two threads writing one socket could interleave packets, so the
`on_socket_register_write` hook is set (to nothing) and paho wakes this thread through its
socketpair instead, which `loop()` watches.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import paho.mqtt.client as paho
from paho.mqtt.enums import MQTTErrorCode

logger = logging.getLogger(__name__)

# How long one loop() pass waits for the socket (a publish from a worker wakes it at once).
PASS_TIMEOUT_S = 1.0
# While reading is held, how often the budget is asked again.
HELD_POLL_S = 0.005


def _not_here(client: paho.Client, userdata: object, sock: object) -> None:
    """paho's register-write hook: nothing to do; its presence keeps paho from writing on a worker."""


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
        self._thread = threading.Thread(target=self._run, name="paho-loop", daemon=True)
        client.on_socket_register_write = _not_here

    def hold(self) -> None:
        """On the network thread, inside a pass: while reading may not go on, write what is queued."""
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
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._connect():
                continue
            try:
                self._serve()
            except Exception:  # the network thread must survive anything a pass does
                logger.exception("MQTT network loop failed; reconnecting")
            if not self._stop.is_set():
                self._stop.wait(self._retry_s())

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
        rc = MQTTErrorCode.MQTT_ERR_SUCCESS
        read_at = time.monotonic()
        while rc == MQTTErrorCode.MQTT_ERR_SUCCESS:
            if self._stop.is_set() and not self._client.want_write():
                return
            if not self._may_read() and time.monotonic() - read_at < self._hold_max_s:
                rc = self._client.loop_write()
                self._client.loop_misc()
                self._stop.wait(HELD_POLL_S)
                continue
            rc = self._client.loop(PASS_TIMEOUT_S)
            read_at = time.monotonic()
            self._after_pass()
