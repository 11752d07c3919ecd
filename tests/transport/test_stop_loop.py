"""stop_loop: paho's loop_stop() race (eclipse-paho #872), reproduced against the real paho Client.

paho's network thread sets `_thread = None` as it ends. When that falls between loop_stop's
None check and its `join()`, loop_stop raises AttributeError. Here the thread is made to end
exactly there: `join` is reached only after the thread has cleared `_thread`.
"""

from __future__ import annotations

import threading

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from daemon.transport.mqtt import stop_loop


class _EndsAtTheCheck(threading.Thread):
    """A stand-in for paho's network thread that ends, clearing the client's `_thread` as
    `_thread_main` does, the moment the caller reads it (the race's window)."""

    def __init__(self, client: paho.Client):
        super().__init__(daemon=True)
        self.client = client
        self.cleared = threading.Event()

    def run(self) -> None:
        self.cleared.wait(5)

    def end_now(self) -> None:
        self.client.__dict__["_thread"] = None
        self.cleared.set()
        self.join()


class _RacingClient(paho.Client):
    """`_thread` reads as the thread the first time, and by then the thread has ended."""

    def __getattribute__(self, name: str):
        if name == "_thread":
            thread = self.__dict__.get("_thread")
            if isinstance(thread, _EndsAtTheCheck) and not thread.cleared.is_set():
                thread.end_now()  # ends after this read: the next read finds None
            return thread
        return super().__getattribute__(name)


def _racing_client() -> paho.Client:
    client = _RacingClient(CallbackAPIVersion.VERSION2)
    thread = _EndsAtTheCheck(client)
    client.__dict__["_thread"] = thread
    thread.start()
    return client


def test_paho_loop_stop_has_the_race():
    """The race is real in the installed paho: if it ever goes away, stop_loop can go too."""
    with pytest.raises(AttributeError):
        _racing_client().loop_stop()


def test_stop_loop_survives_the_thread_ending_at_the_check():
    client = _racing_client()
    stop_loop(client, timeout_s=5)
    assert client.__dict__["_thread"] is None


def test_stop_loop_joins_a_running_loop():
    client = paho.Client(CallbackAPIVersion.VERSION2)
    client.loop_start()
    thread = client._thread
    stop_loop(client, timeout_s=10)
    assert not thread.is_alive()
    stop_loop(client)  # a second stop is harmless
