"""paho_window.Window: replies past the broker's limit wait in order, and each confirmation lets one through."""

from __future__ import annotations

from daemon.transport.paho_window import Window


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
