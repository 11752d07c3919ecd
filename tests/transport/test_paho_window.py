"""The paho link keeps to the broker's ReceiveMaximum: at most that many QoS 1 publishes in flight
(paho_window.Window: replies past the limit wait in order, each confirmation lets one through).

A real mosquitto announcing a ReceiveMaximum of 3 (`max_inflight_messages 3`), the daemon's paho
link over MQTT v5 (the fallback where the native transport's package is missing) with its own window
of 50: paho 2.x reads the CONNACK's property and ignores it; the link applies it at each CONNACK.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pytest

from daemon.config.loader import load_config
from daemon.tools.broker import Broker
from daemon.transport.inbound import Inbound
from daemon.transport.mqtt import MqttLink
from daemon.transport.paho_window import Window

ROOT = Path(__file__).resolve().parents[2]
RECEIVE_MAXIMUM = 3
N = 60


@pytest.fixture
def small_window_broker(tmp_path):
    with Broker(tmp_path / "broker", settings={"max_inflight_messages": str(RECEIVE_MAXIMUM)}) as broker:
        yield broker


def test_replies_in_flight_never_exceed_the_brokers_receive_maximum(small_window_broker, tmp_path):
    host, port = small_window_broker.address.rsplit(":", 1)
    config = dataclasses.replace(load_config(ROOT / "config.yaml", check_models=False).mqtt, broker=f"{host}:{port}",
                                 transport="paho", session_expiry_s=0, client_id="window")
    link = MqttLink(config, [], lambda burst: None, receive_maximum=50)
    confirmed = threading.Event()
    done = []
    link.ack = lambda request: (done.append(request.mid), len(done) >= N and confirmed.set())
    link.start()
    try:
        assert link.connected.wait(10)
        peak = 0
        for i in range(N):
            link.reply("window/t", b"%d" % i, Inbound("requests/t", b"", 1, i, 0.0))
            with link._client._out_message_mutex:
                peak = max(peak, link._client._inflight_messages)
        assert confirmed.wait(10), len(done)
    finally:
        link.stop(1)
    assert sorted(done) == list(range(N))  # every reply confirmed, its request acked
    assert 1 <= peak <= RECEIVE_MAXIMUM


def test_past_the_limit_replies_wait_in_order_and_each_confirmation_sends_the_next():
    sent: list[int] = []
    window: Window[int] = Window(sent.append)
    window.connected(2)
    assert [window.offer(i) for i in range(5)] == [True, True, False, False, False]  # the caller sends 0 and 1
    assert window.waiting == 3 and sent == []
    window.confirmed()
    assert sent == [2]
    window.confirmed()
    window.confirmed()
    assert sent == [2, 3, 4] and window.waiting == 0


def test_before_a_connack_nothing_waits_and_a_new_limit_releases_what_fits():
    sent: list[int] = []
    window: Window[int] = Window(sent.append)
    assert all(window.offer(i) for i in range(3))  # no limit known yet
    window.connected(3)  # those 3 are still in flight (paho resends them)
    assert window.offer(3) is False
    window.connected(5)  # a broker that allows more
    assert sent == [3]


def test_while_replies_wait_a_new_one_queues_behind_them_even_with_room():
    sent: list[int] = []
    window: Window[int] = Window(sent.append)
    window.connected(1)
    assert window.offer(0) is True
    assert window.offer(1) is False
    window.confirmed()  # 1 goes; room again only after its PUBACK
    assert sent == [1] and window.offer(2) is False
    assert window.take_waiting() == [2] and window.waiting == 0
