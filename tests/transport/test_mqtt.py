"""The paho boundary's conversion: what a v5 request carries reaches intake."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import paho.mqtt.client as paho
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from daemon.config.loader import load_config
from daemon.transport import mqtt
from daemon.transport.inbound import Inbound
from daemon.transport.mqtt import MqttLink
from daemon.transport.outbox import Outbox, Row

ROOT = Path(__file__).resolve().parents[2]


def test_a_v5_message_keeps_its_expiry_response_topic_and_correlation_data():
    msg = paho.MQTTMessage(mid=7, topic=b"sensors/d1/imu")
    msg.payload = b"{}"
    msg.qos = 1
    props = Properties(PacketTypes.PUBLISH)
    props.MessageExpiryInterval = 3
    props.ResponseTopic = "me/replies"
    props.CorrelationData = b"c-1"
    msg.properties = props
    inbound = MqttLink._convert(msg)
    assert (inbound.topic, inbound.mid, inbound.qos, inbound.payload) == ("sensors/d1/imu", 7, 1, b"{}")
    assert inbound.expiry_s == 3  # the deadline admission and the worker hold the request to
    assert (inbound.response_topic, inbound.correlation_data) == ("me/replies", b"c-1")


def test_a_3_1_1_message_has_no_deadline_and_no_response_topic():
    msg = paho.MQTTMessage(mid=1, topic=b"sensors/d1/imu")
    msg.payload = b"x"
    inbound = MqttLink._convert(msg)
    assert inbound.expiry_s is None and inbound.response_topic is None and inbound.correlation_data is None


def test_at_stop_only_unconfirmed_replies_are_kept_in_the_outbox(tmp_path):
    """Status and stats (retained), an outbox row being flushed, and an escalation request to a
    far tier (it carries a ResponseTopic) are not replies: the next run must not send them."""
    config = dataclasses.replace(load_config(ROOT / "config.yaml", check_models=False).mqtt, qos=1)
    link = MqttLink(config, ["sensors/+/imu"], lambda burst: None, outbox=Outbox(tmp_path / "outbox", 1 << 20))
    link._flusher.start()  # as MqttLink.start does; it waits for a connection that never comes
    request = Inbound("sensors/d1/imu", b"{}", 1, 5, time.monotonic(), correlation_data=b"c-1")
    # Handed to paho (as a reply made while connected is): unconfirmed, paho keeps it.
    link._publish("results/d1/activity", b"reply", False, request.correlation_data, request)
    link.publish("edge-inferd/n/stats", b"{}", retain=True)
    link.publish("gpu/d1/imu", b"{}", correlation_data=b"esc-1", response_topic="edge-inferd/n/escalations")
    link._flush(Row(1, "results/d9/activity", b"stored", None))
    link.stop(0.1)
    kept = Outbox(tmp_path / "outbox", 1 << 20).oldest(10)
    assert [(r.topic, r.payload, r.correlation_data) for r in kept] == [("results/d1/activity", b"reply", b"c-1")]


def _message(mid: int, retain: bool = False) -> paho.MQTTMessage:
    msg = paho.MQTTMessage(mid=mid, topic=b"sensors/d1/imu")
    msg.payload, msg.qos, msg.retain = b"%d" % mid, 1, retain
    return msg


def _link(handler) -> MqttLink:
    config = load_config(ROOT / "config.yaml", check_models=False).mqtt
    return MqttLink(config, ["sensors/+/imu"], handler)


def test_a_read_burst_reaches_intake_in_one_call_in_order():
    bursts: list[list[int]] = []
    link = _link(lambda burst: bursts.append([i.mid for i in burst]))
    for mid in (1, 2, 3):
        link._on_message(link._client, None, _message(mid))
    assert bursts == []  # held until the burst ends
    link._hand_on_burst()
    link._hand_on_burst()  # an empty burst is not handed on
    assert bursts == [[1, 2, 3]]


def test_a_long_burst_is_handed_on_in_parts_of_max_burst():
    sizes: list[int] = []
    link = _link(lambda burst: sizes.append(len(burst)))
    for mid in range(1, 2 * mqtt.MAX_BURST + 2):
        link._on_message(link._client, None, _message(mid))
    link._hand_on_burst()
    assert sizes == [mqtt.MAX_BURST, mqtt.MAX_BURST, 1]


def test_a_handler_that_raises_costs_only_its_burst(caplog):
    bursts: list[list[int]] = []

    def handler(burst):
        bursts.append([i.mid for i in burst])
        if len(bursts) == 1:
            raise RuntimeError("boom")

    link = _link(handler)
    link._on_message(link._client, None, _message(1))
    link._hand_on_burst()  # raises inside: logged, the loop thread goes on
    link._on_message(link._client, None, _message(2))
    link._hand_on_burst()
    assert bursts == [[1], [2]]
    assert "failed to hand on 1 message" in caplog.text


def test_after_close_intake_a_burst_stays_unacked_and_retained_messages_are_not_requests():
    bursts: list = []
    link = _link(bursts.append)
    acked: list[int] = []
    link._client.ack = lambda mid, qos: acked.append(mid)
    link._on_message(link._client, None, _message(1, retain=True))
    link._on_message(link._client, None, _message(2))
    link.close_intake()
    link._hand_on_burst()
    assert bursts == [] and acked == [1]
