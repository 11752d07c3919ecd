"""sd_notify over a real AF_UNIX datagram socket: READY once, a watchdog fed only by progress."""

from __future__ import annotations

import socket

import pytest

from daemon.lifecycle.notify import Notifier
from tests.fakes import FakeClock


@pytest.fixture
def systemd_socket(tmp_path):
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(0)
    yield path, sock
    sock.close()


def _received(sock) -> list[str]:
    out = []
    while True:
        try:
            out.append(sock.recv(4096).decode())
        except BlockingIOError:
            return out


def test_ready_once_then_pings_only_when_due_and_progressing(systemd_socket):
    path, sock = systemd_socket
    clock = FakeClock()
    notifier = Notifier({"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "10000000"}, clock)  # 10 s: ping every 5 s
    assert notifier.enabled and notifier.watchdog_interval_s == 5.0
    notifier.ready("serving")
    notifier.ready("serving again")
    notifier.watchdog(progressing=True)  # first ping at once
    clock.now = 4.0
    notifier.watchdog(progressing=True)  # not due
    clock.now = 6.0
    notifier.watchdog(progressing=False)  # due, but stalled: no ping
    clock.now = 7.0
    notifier.watchdog(progressing=True)
    notifier.stopping()
    assert _received(sock) == ["READY=1\nSTATUS=serving", "WATCHDOG=1", "WATCHDOG=1", "STOPPING=1"]


def test_outside_systemd_every_call_is_a_no_op():
    notifier = Notifier({})
    assert not notifier.enabled and notifier.watchdog_interval_s is None
    notifier.ready("x")
    notifier.watchdog(progressing=True)


def test_an_abstract_socket_name_is_understood(tmp_path):
    name = f"edge-inferd-test-{tmp_path.name}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(5)
    try:
        Notifier({"NOTIFY_SOCKET": "@" + name}).status("hello")
        assert sock.recv(100) == b"STATUS=hello"
    finally:
        sock.close()
