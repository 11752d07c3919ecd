"""LinkCommon._subscribed: a SUBACK's refusals are each named; `online` only when something was granted."""

from __future__ import annotations

import logging
import threading

from daemon.config.mqtt import MqttConfig
from daemon.transport.link_common import STATUS_ONLINE, LinkCommon


class _Link(LinkCommon):
    """The client-independent half with a recording publish (what `online` goes through)."""

    def __init__(self, filters: tuple[str, ...]):
        self._config = MqttConfig(broker="broker.lan", client_id="gw1")
        self._filters = filters
        self._subscribing = threading.Event()
        self._subscribing.set()
        self.online = threading.Event()
        self.reconnects = 0
        self.published: list[tuple[str, bytes]] = []

    def publish(self, topic, payload, retain=False, correlation_data=None, response_topic=None):
        self.published.append((topic, payload))


def test_a_partly_refused_suback_names_the_refusal_and_goes_online(caplog):
    link = _Link(("sensors/+/imu", "$share/g/plugs/+/power"))
    with caplog.at_level(logging.ERROR):
        link._subscribed([(1, "Granted QoS 1"), (0x9E, "Shared Subscriptions not supported")])
    assert "refused the subscription to '$share/g/plugs/+/power': Shared Subscriptions not supported" in caplog.text
    assert link.online.is_set() and link.published == [("edge-inferd/gw1/status", STATUS_ONLINE)]
    assert "serves nothing" not in caplog.text


def test_every_filter_refused_says_the_daemon_serves_nothing_and_stays_offline(caplog):
    link = _Link(("sensors/+/imu", "plugs/+/power"))
    with caplog.at_level(logging.ERROR):
        link._subscribed([(0x87, "Not authorized"), (0x87, "Not authorized")])
    assert caplog.text.count("refused the subscription") == 2
    assert "refused every subscription: this daemon serves nothing and stays offline" in caplog.text
    assert not link.online.is_set() and link.published == []
