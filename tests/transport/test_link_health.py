"""The link's words for connect failures, refusals, drops and a shared client id (fake clock)."""

from __future__ import annotations

import logging
import socket
import ssl

from daemon.transport.link_health import CLASH_DROPS, SESSION_TAKEN_OVER, LinkHealth, connect_cause
from tests.fakes import FakeClock


def _health(clock: FakeClock) -> LinkHealth:
    return LinkHealth("broker.lan:1883", "edge-inferd-gw1", 1, 8, clock)


def test_each_cause_is_named():
    assert connect_cause(ConnectionRefusedError(111, "refused"), "h", 1883).startswith("refused: nothing accepts")
    assert connect_cause(socket.gaierror(-2, "Name or service not known"), "nohost", 1883) == \
        "DNS: cannot resolve 'nohost' (Name or service not known)"
    assert connect_cause(TimeoutError(), "h", 1883) == "unreachable: timed out"
    assert connect_cause(OSError(113, "No route to host"), "h", 1883) == "unreachable: No route to host"
    verify = ssl.SSLCertVerificationError(1, "certificate verify failed")
    verify.reason, verify.verify_message = "CERTIFICATE_VERIFY_FAILED", "unable to get local issuer certificate"
    assert connect_cause(verify, "h", 8883) == ("TLS: the broker's certificate was not accepted: "
                                                "CERTIFICATE_VERIFY_FAILED (unable to get local issuer certificate)")


def test_failed_connects_say_when_the_next_try_is_and_are_throttled(caplog):
    clock = FakeClock()
    health = _health(clock)
    with caplog.at_level(logging.WARNING):
        for _ in range(5):  # paho's delays 1, 2, 4, 8, 8 s; the log holds one line per 10 s
            health.connect_failed(ConnectionRefusedError(111, "refused"), "broker.lan", 1883)
            clock.now += health.next_retry_s()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert lines[0].startswith("cannot connect to broker.lan:1883: refused")
    assert "next try in 1 s (attempt 1)" in lines[0]
    assert "next try in 8 s (attempt 5)" in lines[1] and "(3 similar suppressed)" in lines[1]
    health.connected()
    assert health.next_retry_s() == 1


def test_refused_credentials_point_at_the_keys(caplog):
    with caplog.at_level(logging.WARNING):
        _health(FakeClock()).refused(0x86, "Bad user name or password")
    assert "refused the connection: Bad user name or password (check mqtt.username and the password)" in caplog.text


def test_a_session_taken_over_is_named(caplog):
    health = _health(FakeClock())
    health.connected()
    with caplog.at_level(logging.WARNING):
        health.dropped(SESSION_TAKEN_OVER, "Session taken over")
    assert "session taken over: another client connected to broker.lan:1883 with client_id 'edge-inferd-gw1'" \
        in caplog.text


def test_connections_that_keep_dropping_right_after_connecting_are_reported_as_an_id_clash(caplog):
    clock = FakeClock()
    health = _health(clock)
    with caplog.at_level(logging.WARNING):
        for _ in range(CLASH_DROPS):
            health.connected()
            clock.now += 1.5
            health.dropped(0x80, "Unspecified error")
            clock.now += 1.0
    assert "another client is probably using client_id 'edge-inferd-gw1'" in caplog.records[-1].getMessage()


def test_one_drop_after_a_long_connection_is_just_a_drop(caplog):
    clock = FakeClock()
    health = _health(clock)
    with caplog.at_level(logging.WARNING):
        for _ in range(CLASH_DROPS):  # e.g. broker restarts, hours apart
            health.connected()
            clock.now += 3600
            health.dropped(0x80, "Unspecified error")
    assert "client_id" not in caplog.text and "disconnected from broker.lan:1883" in caplog.text


def test_a_broker_reason_is_named_with_what_to_do_and_never_taken_for_an_id_clash(caplog):
    """ejabberd answers a $share SUBSCRIBE with DISCONNECT 0x9E, at every reconnect: each drop is
    short, but the broker said why, so the log says that and not "another client"."""
    clock = FakeClock()
    health = _health(clock)
    with caplog.at_level(logging.WARNING):
        for _ in range(CLASH_DROPS + 2):
            health.connected()
            clock.now += 0.5
            health.dropped(0x9E, "Shared Subscriptions not supported")
            clock.now += 20.0  # past the throttle: each drop is logged
    lines = [r.getMessage() for r in caplog.records]
    assert lines and all("Shared Subscriptions not supported (reason 0x9E)" in line for line in lines)
    assert all("remove mqtt.share_group" in line and "client_id" not in line for line in lines)


def test_an_unlisted_reason_code_is_named_too(caplog):
    health = _health(FakeClock())
    health.connected()
    with caplog.at_level(logging.WARNING):
        health.dropped(0x89, "Server busy")
    assert "disconnected the daemon: Server busy (reason 0x89); reconnecting" in caplog.text


def test_a_keepalive_timeout_is_the_daemons_own_finding_not_the_brokers(caplog):
    """paho reports its own keepalive detection as reason 0x8D: a plain drop, not a broker's word."""
    health = _health(FakeClock())
    health.connected()
    with caplog.at_level(logging.WARNING):
        health.dropped(0x8D, "Keep alive timeout")
    assert "disconnected from broker.lan:1883 (Keep alive timeout); reconnecting" in caplog.text
