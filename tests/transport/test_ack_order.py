"""AckOrder: PUBACKs leave in the order their PUBLISHes arrived (MQTT 3.1.1 and v5, section 4.6)."""

from __future__ import annotations

import random
import threading

from daemon.transport.ack_order import AckOrder
from daemon.transport.inbound import Inbound


def _inbound(mid: int, qos: int = 1) -> Inbound:
    return Inbound("t", b"", qos, mid, 0.0)


class Wire:
    def __init__(self):
        self.mids: list[int] = []

    def send(self, turn: list[Inbound]) -> None:
        self.mids += [i.mid for i in turn]


def test_an_ack_waits_for_every_earlier_request_then_they_go_in_order():
    wire = Wire()
    order = AckOrder(wire.send)
    a, b, c = (_inbound(m) for m in (1, 2, 3))
    for x in (a, b, c):
        order.arrived(x)
    order.ack(c)
    order.ack(b)
    assert wire.mids == [] and order.waiting == 3
    order.ack(a)
    assert wire.mids == [1, 2, 3] and order.waiting == 0


def test_qos0_is_never_queued_nor_sent():
    wire = Wire()
    order = AckOrder(wire.send)
    zero, one = _inbound(0, qos=0), _inbound(7)
    order.arrived(zero)
    order.arrived(one)
    order.ack(zero)
    order.ack(one)
    assert wire.mids == [7]


def test_a_request_of_an_earlier_connection_is_not_acked_on_the_new_one():
    """Its packet id may name another message now: the broker redelivers it instead."""
    wire = Wire()
    order = AckOrder(wire.send)
    old = _inbound(5)
    order.arrived(old)
    order.new_connection()
    new = _inbound(5)  # the broker reuses the id on the new connection
    order.arrived(new)
    order.ack(old)
    assert wire.mids == [] and order.stale == 1
    order.ack(new)
    assert wire.mids == [5]


def test_many_threads_acking_in_any_order_still_send_in_arrival_order():
    wire = Wire()
    order = AckOrder(wire.send)
    requests = [_inbound(m % 65535 + 1) for m in range(5000)]
    for r in requests:
        order.arrived(r)
    shuffled = requests[:]
    random.Random(7).shuffle(shuffled)
    threads = [threading.Thread(target=lambda part: [order.ack(r) for r in part], args=(shuffled[k::4],))
               for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wire.mids == [r.mid for r in requests]
