"""safe_ack.py: a held window's requests are acked once their replies are on disk, and only then."""

from __future__ import annotations

import threading
import time

from daemon.transport.ack_order import AckOrder
from daemon.transport.inbound import Inbound
from daemon.transport.link_common import Out
from daemon.transport.native_window import PublishWindow
from daemon.transport.outbox import Outbox, OutboxFlusher, Row
from daemon.transport.puback import AwaitingPuback
from daemon.transport.safe_ack import SafeAck

WINDOW = 3


class Link:
    """The parts of the native link SafeAck works with, wired as native.py wires them."""

    def __init__(self, tmp_path, max_bytes: int = 1 << 20, window: int = WINDOW, quiet_s: float = 0.0):
        self.sent: list[int] = []  # mids of the requests acked, in order
        self.order = AckOrder(lambda turn: self.sent.extend(i.mid for i in turn))
        self.done: list[object] = []
        self.awaiting = AwaitingPuback(self._published)
        self.lock = threading.Lock()
        self.publishes = PublishWindow(2)  # a reply queued behind the window is moved too
        self.outbox = Outbox(tmp_path / "outbox", max_bytes)
        self.flusher = OutboxFlusher(self.outbox, lambda row: None, threading.Event())  # not started
        self.now = 0.0
        self.safe = SafeAck(window, self.order, self.lock, self.publishes, self.awaiting, self.outbox,
                            self.flusher, self.order.ack, quiet_s=quiet_s, clock=lambda: self.now)

    def _published(self, owner: object) -> None:
        self.done.append(owner)
        if isinstance(owner, Inbound):
            self.order.ack(owner)
        elif isinstance(owner, Row):
            self.flusher.confirmed(owner)

    def receive(self, n: int) -> list[Inbound]:
        requests = [Inbound(f"in/{k}", b"{}", 1, 100 + k, time.monotonic()) for k in range(n)]
        for inbound in requests:
            self.order.arrived(inbound)
        return requests

    def reply(self, inbound: Inbound) -> None:
        self.order.answered(inbound)
        mid = self.publishes.offer(Out(f"out/{inbound.mid}", b"re", False, b"c", None, inbound))
        if mid is not None:
            self.awaiting.register(mid, inbound)

    def puback(self, mid: int) -> None:
        known, admitted = self.publishes.acked(mid)
        assert known
        for next_mid, out in admitted:
            self.awaiting.register(next_mid, out.owner)
        self.awaiting.completed(mid)


def test_a_full_window_of_answered_requests_is_acked_once_the_replies_are_on_disk(tmp_path):
    link = Link(tmp_path)
    first, second, third = link.receive(WINDOW)
    link.reply(first)
    link.reply(third)
    link.safe.check()
    assert link.sent == [] and link.outbox.rows == 0  # `second` is being worked on: not held
    link.reply(second)
    link.safe.check()
    assert link.sent == [100, 101, 102]  # in arrival order
    assert [(r.topic, r.correlation_data) for r in link.outbox.oldest(10)] == [("out/100", b"c"), ("out/102", b"c"),
                                                                             ("out/101", b"c")]
    assert (link.safe.acks, link.safe.flushes) == (3, 1)
    link.puback(1)  # the broker confirms the first reply at last: its row goes, nothing is acked twice
    assert link.outbox.rows == 2 and link.sent == [100, 101, 102]
    assert link.order.stale == 0


def test_a_reply_confirmed_before_the_window_filled_is_not_stored_and_its_turn_still_comes(tmp_path):
    link = Link(tmp_path)
    requests = link.receive(WINDOW)
    for inbound in reversed(requests):
        link.reply(inbound)
    link.puback(1)  # the last request's reply: ackable, held behind the first two
    link.safe.check()
    assert link.sent == [100, 101, 102] and link.outbox.rows == 2


def test_below_the_window_nothing_is_stored(tmp_path):
    link = Link(tmp_path)
    requests = link.receive(WINDOW - 1)
    for inbound in requests:
        link.reply(inbound)
    link.safe.check()
    assert link.sent == [] and link.outbox.rows == 0 and link.safe.acks == 0


def test_an_outbox_too_full_for_the_lot_acks_nothing(tmp_path):
    link = Link(tmp_path, max_bytes=150)  # room for one reply (two ROW_OVERHEAD_BYTES do not fit)
    for inbound in link.receive(WINDOW):
        link.reply(inbound)
    link.safe.check()
    assert link.sent == [] and link.outbox.rows == 0


def test_a_new_connection_forgets_what_was_answered(tmp_path):
    link = Link(tmp_path)
    for inbound in link.receive(WINDOW):
        link.reply(inbound)
    link.order.new_connection()  # the broker redelivers those requests
    link.receive(WINDOW)
    link.safe.check()
    assert link.sent == [] and link.outbox.rows == 0


def test_the_flusher_never_hands_a_row_the_link_already_holds(tmp_path):
    link = Link(tmp_path)
    for inbound in link.receive(WINDOW):
        link.reply(inbound)
    link.outbox.put_many([("out/away", b"stored while away", None)])  # a row the flusher must send
    link.safe.check()
    handed: list[Row] = []
    connected = threading.Event()
    connected.set()
    flusher = link.flusher
    flusher._publish, flusher._connected = handed.append, connected
    flusher.start()
    try:
        deadline = time.monotonic() + 10
        while not handed and time.monotonic() < deadline:
            time.sleep(0.01)  # polled: the flusher has no event to wait on; the limit bounds a failure
    finally:
        flusher.stop()
    assert [r.topic for r in handed] == ["out/away"]


def test_a_window_is_relieved_only_once_no_puback_came_for_the_quiet_time(tmp_path):
    link = Link(tmp_path, quiet_s=0.02)
    requests = link.receive(WINDOW)
    for inbound in requests:
        link.reply(inbound)
    link.safe.check()
    assert link.sent == [] and link.safe.due() == 0.02  # seen now; the wait ends then
    link.now = 0.015
    link.safe.heard()  # a PUBACK (a broker that confirms, as mosquitto does): the clock starts again
    link.safe.check()
    link.now = 0.03
    link.safe.check()
    assert link.sent == [] and link.outbox.rows == 0
    link.now = 0.036
    link.safe.check()  # 0.021 s with none heard: held
    assert link.sent == [100, 101, 102] and link.safe.due() is None
