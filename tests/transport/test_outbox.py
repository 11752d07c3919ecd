"""The on-disk outbox: order, bound, persistence, and a flusher that never hands a row twice."""

from __future__ import annotations

import threading

from daemon.transport.outbox import FLUSH_WINDOW, ROW_OVERHEAD_BYTES, Outbox, OutboxFlusher, Row


def _replies(n: int, start: int = 0) -> list[tuple[str, bytes, bytes | None]]:
    return [(f"results/{i}", b'{"id": %d}' % i, b"c%d" % i if i % 2 else None) for i in range(start, start + n)]


def test_rows_come_back_in_the_order_stored_with_their_correlation_data(tmp_path):
    box = Outbox(tmp_path / "o", 1 << 20)
    assert box.put_many(_replies(5)) == 5
    rows = box.oldest(10)
    assert [(r.topic, r.payload, r.correlation_data) for r in rows] == _replies(5)
    assert [r.topic for r in box.oldest(2, after=rows[1].id)] == ["results/2", "results/3"]


def test_a_full_outbox_refuses_the_newest_and_counts_it(tmp_path):
    one = len("results/0") + len(b'{"id": 0}') + ROW_OVERHEAD_BYTES
    box = Outbox(tmp_path / "o", 3 * one)
    assert box.put_many(_replies(5)) == 3
    assert box.snapshot() == {"stored": 3, "bytes": 3 * one, "dropped": 2, "flushed": 0}
    box.remove(box.oldest(1)[0])
    assert box.put_many(_replies(1, start=7)) == 1  # room again
    assert [r.topic for r in box.oldest(10)] == ["results/1", "results/2", "results/7"]


def test_rows_survive_a_restart_and_removal_is_counted_once(tmp_path):
    box = Outbox(tmp_path / "o", 1 << 20)
    box.put_many(_replies(3))
    box.close()
    again = Outbox(tmp_path / "o", 1 << 20)
    rows = again.oldest(10)
    assert [r.topic for r in rows] == ["results/0", "results/1", "results/2"]
    again.remove(rows[0])
    again.remove(rows[0])
    assert again.snapshot()["stored"] == 2 and again.snapshot()["flushed"] == 1
    assert (tmp_path / "o").stat().st_mode & 0o777 == 0o700


class _Paho:
    """Records what the flusher hands over; the test plays the broker's PUBACKs."""

    def __init__(self):
        self.handed: list[Row] = []
        self.cond = threading.Condition()

    def publish(self, row: Row) -> None:
        with self.cond:
            self.handed.append(row)
            self.cond.notify_all()

    def wait(self, n: int) -> list[Row]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.handed) >= n, 10)
            return list(self.handed)


def test_the_flusher_hands_rows_in_order_a_window_at_a_time_never_twice(tmp_path):
    box = Outbox(tmp_path / "o", 1 << 24)
    box.put_many(_replies(FLUSH_WINDOW + 10))
    paho, connected = _Paho(), threading.Event()
    flusher = OutboxFlusher(box, paho.publish, connected)
    flusher.start()
    connected.set()
    flusher.wake()
    first = paho.wait(FLUSH_WINDOW)
    assert [r.topic for r in first] == [f"results/{i}" for i in range(FLUSH_WINDOW)]
    for row in first[:10]:  # PUBACKs: each confirmed row leaves the disk and makes room
        flusher.confirmed(row)
    everything = paho.wait(FLUSH_WINDOW + 10)
    flusher.stop()
    assert [r.topic for r in everything] == [f"results/{i}" for i in range(FLUSH_WINDOW + 10)]  # none twice
    assert box.snapshot()["stored"] == FLUSH_WINDOW and box.snapshot()["flushed"] == 10
