"""paho_client keeps to the broker's ReceiveMaximum: at most that many QoS 1 publishes in flight.

A real mosquitto announcing a ReceiveMaximum of 3 (`max_inflight_messages 3`), the daemon's paho
client with its own window of 50: paho 2.x ignores the CONNACK's property, `fit_window` applies it.
"""

from __future__ import annotations

import threading

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from daemon.tools.broker import Broker
from daemon.transport import paho_client

RECEIVE_MAXIMUM = 3
N = 60


@pytest.fixture
def small_window_broker(tmp_path):
    with Broker(tmp_path / "broker", settings={"max_inflight_messages": str(RECEIVE_MAXIMUM)}) as broker:
        yield broker


def _client(broker: Broker, fit: bool) -> tuple[paho_client.Client, threading.Event, list, threading.Event]:
    client = paho_client.Client(CallbackAPIVersion.VERSION2, client_id="window", protocol=paho.MQTTv5)
    client.max_inflight_messages_set(50)
    connected, acked, all_acked = threading.Event(), [], threading.Event()

    def on_connect(c, userdata, flags, reason, properties):
        if fit:
            c.fit_window(properties.ReceiveMaximum)
        connected.set()

    client.on_connect = on_connect

    def on_publish(c, userdata, mid, reason, properties):
        acked.append(reason)
        if len(acked) >= N:
            all_acked.set()

    client.on_publish = on_publish
    host, port = broker.address.rsplit(":", 1)
    client.connect(host, int(port))
    return client, connected, acked, all_acked


@pytest.mark.parametrize("fit", [True, False])
def test_publishes_in_flight_never_exceed_the_brokers_receive_maximum(small_window_broker, fit):
    client, connected, acked, all_acked = _client(small_window_broker, fit)
    client.loop_start()
    try:
        assert connected.wait(10)
        peak = 0
        for i in range(N):
            client.publish("window/t", b"%d" % i, qos=1)
            with client._out_message_mutex:
                peak = max(peak, client._inflight_messages)
        assert all_acked.wait(10), len(acked)
    finally:
        client.loop_stop()
        client.disconnect()
    assert len(acked) == N and all(not reason.is_failure for reason in acked)  # every publish confirmed
    if fit:
        assert peak <= RECEIVE_MAXIMUM
    else:  # paho alone: its own window, past the broker's (what fit_window is for)
        assert peak > RECEIVE_MAXIMUM
