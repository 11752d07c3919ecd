"""GrantLog: each CONNACK shortfall becomes one log line naming the broker and the key, once."""

from __future__ import annotations

import logging

import pytest

from daemon.config.mqtt import MqttConfig
from daemon.transport.broker_grants import GrantLog, Grants

URL = "mqtt://broker.lan:1883"


def _log(caplog, grants: list[Grants], window: int = 1024, largest: int = 65536, **config) -> list[str]:
    log = GrantLog(MqttConfig(broker="broker.lan", **config), window, largest)
    with caplog.at_level(logging.INFO, logger="daemon.transport.broker_grants"):
        for g in grants:
            log.connack(g)
    return [r.getMessage() for r in caplog.records]


def test_a_broker_granting_all_that_was_asked_says_nothing(caplog):
    assert _log(caplog, [Grants(session_present=False), Grants(session_present=True)]) == []


def test_a_shorter_session_is_named_with_both_intervals_and_the_key(caplog):
    [line] = _log(caplog, [Grants(False, session_expiry_s=300)] + [Grants(True, session_expiry_s=300)] * 2)  # once
    assert URL in line and "300 s" in line and "86400 s" in line and "mqtt.session_expiry_s" in line


def test_a_clean_session_config_does_not_complain_about_expiry(caplog):
    assert _log(caplog, [Grants(False, session_expiry_s=0)], session_expiry_s=0) == []


def test_a_session_lost_across_a_reconnect_is_named(caplog):
    lines = _log(caplog, [Grants(False), Grants(False)])  # the first connect of a run may start fresh
    assert len(lines) == 1 and "did not keep this daemon's session across the reconnect" in lines[0]


def test_no_shared_subscriptions_with_a_share_group_is_an_error(caplog):
    lines = _log(caplog, [Grants(False, shared_subscriptions=False)], share_group="g")
    assert len(lines) == 1 and "'g'" in lines[0] and "mqtt.share_group" in lines[0]
    assert caplog.records[0].levelno == logging.ERROR
    caplog.clear()
    assert _log(caplog, [Grants(False, shared_subscriptions=False)]) == []  # no group: nothing to refuse


def test_a_smaller_reply_window_is_named_with_both_sizes(caplog):
    [line] = _log(caplog, [Grants(False, receive_maximum=20)], window=1024)
    assert "20 replies in flight" in line and "1024" in line


@pytest.mark.parametrize("maximum, said", [(1000, True), (65536, False), (None, False)])
def test_a_packet_limit_below_the_largest_request_is_named(caplog, maximum, said):
    lines = _log(caplog, [Grants(False, maximum_packet_size=maximum)], largest=65536)
    assert bool(lines) is said
    if said:
        assert "1000 bytes" in lines[0] and "65536" in lines[0] and "input.max_bytes" in lines[0]


def test_a_changed_grant_is_said_again(caplog):
    lines = _log(caplog, [Grants(False, receive_maximum=20), Grants(True, receive_maximum=20),
                          Grants(True, receive_maximum=10)])
    assert len(lines) == 2 and "10 replies" in lines[1]


def test_mqtt_3_1_1_has_no_properties_but_a_lost_session_is_still_named(caplog):
    lines = _log(caplog, [Grants(False, receive_maximum=1), Grants(False, receive_maximum=1)], protocol=311)
    assert len(lines) == 1 and "across the reconnect" in lines[0]
