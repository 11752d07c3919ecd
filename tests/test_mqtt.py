"""The paho boundary's conversion: what a v5 request carries reaches the dispatcher."""

from __future__ import annotations

import paho.mqtt.client as paho
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from daemon.mqtt import MqttLink


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
