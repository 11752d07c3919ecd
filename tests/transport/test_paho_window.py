"""The paho link keeps to the broker's ReceiveMaximum: at most that many QoS 1 publishes in flight.

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
