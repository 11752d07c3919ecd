"""What mosquitto does with a dead share-group member's messages (docs/scaling.md).

Two persistent-session v5 clients A and B share `$share/g/probe/t` (QoS 1, manual ack).
A receives its share of a first burst and acks none of it, then dies (its socket is closed
without DISCONNECT, like a SIGKILLed process). A second burst is published while A is away.
Then A reconnects under its id. Printed: what A got before dying, what B got, what A got
on its return (redelivered and new). Run: python scripts/probe_share_group.py
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from daemon.tools.broker import Broker  # noqa: E402

BURST = 100
SETTLE_S = 1.0  # a probe, not a test: time for the broker to hand everything out


def member(port: int, client_id: str, got: list, ack: bool) -> paho.Client:
    c = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv5, manual_ack=True)
    lock = threading.Lock()

    def on_message(client, userdata, msg):
        with lock:
            got.append(int(msg.payload))
        if ack:
            client.ack(msg.mid, msg.qos)
    c.on_message = on_message
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 3600
    c.connect("127.0.0.1", port, clean_start=False, properties=props)
    c.subscribe("$share/g/probe/t", qos=1)
    c.loop_start()
    return c


def main() -> None:
    with Broker() as broker:
        a_before, b_got, a_after = [], [], []
        a = member(broker.port, "A", a_before, ack=False)
        b = member(broker.port, "B", b_got, ack=True)
        pub = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
        pub.connect("127.0.0.1", broker.port)
        pub.loop_start()
        time.sleep(SETTLE_S)
        for i in range(BURST):
            pub.publish("probe/t", str(i), qos=1).wait_for_publish(5)
        time.sleep(SETTLE_S)
        a.loop_stop()
        a.socket().close()  # dies: no DISCONNECT, its session and unacked messages stay
        time.sleep(SETTLE_S)
        for i in range(BURST, 2 * BURST):
            pub.publish("probe/t", str(i), qos=1).wait_for_publish(5)
        time.sleep(SETTLE_S)
        b_while_away = [m for m in b_got if m >= BURST]
        a2 = member(broker.port, "A", a_after, ack=True)
        time.sleep(SETTLE_S)
        print(json.dumps({
            "first_burst_to_A_unacked": len(a_before), "first_burst_to_B": len([m for m in b_got if m < BURST]),
            "second_burst_to_B_while_A_away": len(b_while_away),
            "A_on_return_redelivered_from_first_burst": len([m for m in a_after if m < BURST]),
            "A_on_return_from_second_burst": len([m for m in a_after if m >= BURST]),
            "lost": sorted(set(range(2 * BURST)) - set(a_before + b_got + a_after))[:10],
        }, indent=1))
        for c in (a2, b, pub):
            c.disconnect()
            c.loop_stop()


if __name__ == "__main__":
    main()
