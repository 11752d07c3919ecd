"""The on-disk outbox: replies made while the broker is away, kept until it confirms them.

A reply whose broker connection is down when it is ready goes here instead of into
paho's memory, and so do the replies paho still holds unconfirmed when the daemon
stops. On (re)connect `OutboxFlusher` publishes the rows in the order they were stored,
a window at a time, and deletes each once the broker's PUBACK is back: a row handed to
paho is never handed again by this process (paho resends its own unconfirmed publishes
after a reconnect), so nothing goes out twice at once, and a row leaves the disk only
once the broker has it. A restarted daemon flushes what the last run stored.

Storage is SQLite (the standard library; rows are plain topic/payload bytes, nothing is
unpickled). Bounded by `mqtt.outbox.max_mb`: past it the newest reply is refused and
counted (`dropped`); its request is still unacked at the broker, which redelivers it on
reconnect, so a QoS 1 request is answered late rather than lost (a QoS 0 request's reply
is lost, and counted).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from daemon.obs.throttled_log import ThrottledLog

logger = logging.getLogger(__name__)

# Replies handed to paho at once while flushing (each waits for its PUBACK).
FLUSH_WINDOW = 64
# After a failed read of the stored rows, the flusher tries again this much later.
RETRY_S = 5.0
# Bytes a row costs besides its topic and payload (SQLite page and index overhead).
ROW_OVERHEAD_BYTES = 64
_SCHEMA = ("CREATE TABLE IF NOT EXISTS replies (id INTEGER PRIMARY KEY AUTOINCREMENT, topic TEXT NOT NULL, "
           "payload BLOB NOT NULL, correlation BLOB)")


@dataclass(frozen=True)
class Row:
    id: int
    topic: str
    payload: bytes
    correlation_data: Optional[bytes]


class Outbox:
    """A bounded FIFO of replies in one SQLite file; safe to use from several threads."""

    def __init__(self, directory: Path, max_bytes: int):
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.path = directory / "outbox.sqlite"
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # durable across a daemon crash; a power cut may lose the tail
        self._db.execute(_SCHEMA)
        self._rows, self._bytes = self._db.execute(
            f"SELECT COUNT(*), COALESCE(SUM(LENGTH(topic) + LENGTH(payload) + {ROW_OVERHEAD_BYTES}), 0) "
            "FROM replies").fetchone()
        self.dropped = self.flushed = 0
        self._log = ThrottledLog(logger)
        if self._rows:
            logger.info("outbox %s holds %d repl%s from an earlier run; they go out once connected",
                        self.path, self._rows, "y" if self._rows == 1 else "ies")

    def put_many(self, replies: list[tuple[str, bytes, Optional[bytes]]]) -> int:
        """Store replies (topic, payload, correlation data) in order; returns how many fitted.
        Raises OSError or sqlite3.Error when the disk refuses (nothing is counted then)."""
        with self._lock:
            kept, room = [], self._max_bytes - self._bytes
            for topic, payload, correlation in replies:
                size = _size(topic, payload)
                if size <= room:
                    room -= size
                    kept.append((topic, payload, correlation))
            if kept:
                with self._db:
                    self._db.executemany("INSERT INTO replies (topic, payload, correlation) VALUES (?, ?, ?)", kept)
            self.dropped += len(replies) - len(kept)
            self._bytes = self._max_bytes - room
            self._rows += len(kept)
            return len(kept)

    def put_rows(self, replies: list[tuple[str, bytes, Optional[bytes]]]) -> list[Row]:
        """Store all the replies in one transaction, or none (an empty list) when they do not all
        fit; returns their rows, in order. Raises OSError or sqlite3.Error when the disk refuses."""
        sizes = [_size(topic, payload) for topic, payload, _ in replies]
        with self._lock:
            if sum(sizes) > self._max_bytes - self._bytes:
                return []
            with self._db:
                rows = [Row(self._db.execute("INSERT INTO replies (topic, payload, correlation) VALUES (?, ?, ?)",
                                             reply).lastrowid, *reply) for reply in replies]
            self._bytes += sum(sizes)
            self._rows += len(rows)
            return rows

    def oldest(self, limit: int, after: int = 0) -> list[Row]:
        with self._lock:
            found = self._db.execute("SELECT id, topic, payload, correlation FROM replies WHERE id > ? "
                                     "ORDER BY id LIMIT ?", (after, limit)).fetchall()
        return [Row(i, t, bytes(p), None if c is None else bytes(c)) for i, t, p, c in found]

    def remove(self, row: Row) -> None:
        """The broker has this row; a failed delete only means it may be sent again next run."""
        with self._lock:
            try:
                deleted = self._db.execute("DELETE FROM replies WHERE id = ?", (row.id,)).rowcount
            except sqlite3.Error as exc:
                self._log.warning("remove", "outbox %s: cannot delete a sent reply (%s)", self.path, exc)
                return
            if deleted:
                self._rows -= 1
                self._bytes -= _size(row.topic, row.payload)
                self.flushed += 1

    @property
    def rows(self) -> int:
        return self._rows

    def snapshot(self) -> dict:
        return {"stored": self._rows, "bytes": self._bytes, "dropped": self.dropped, "flushed": self.flushed}

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _size(topic: str, payload: bytes) -> int:
    return len(topic.encode()) + len(payload) + ROW_OVERHEAD_BYTES


class OutboxFlusher:
    """One thread: while connected, keeps up to FLUSH_WINDOW stored replies handed to paho, in order."""

    def __init__(self, outbox: Outbox, publish: Callable[[Row], None], connected: threading.Event):
        self._outbox = outbox
        self._publish = publish
        self._connected = connected
        self._cond = threading.Condition()
        self._handed: dict[int, Row] = {}  # rows paho holds: never handed twice by this process
        self._adopted: set[int] = set()  # ids of rows the link already holds as publishes (adopt)
        self._last_handed = 0
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="outbox", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        """Something changed: connected, or stored rows."""
        with self._cond:
            self._cond.notify()

    def adopt(self, rows: list[Row]) -> None:
        """Rows stored for publishes the link holds already (native safe_ack.py): never handed;
        each leaves the disk on `confirmed`, like a handed row."""
        with self._cond:
            self._adopted.update(row.id for row in rows)

    def confirmed(self, row: Row) -> None:
        """paho thread: the broker has this row (its PUBACK)."""
        self._outbox.remove(row)
        with self._cond:
            self._handed.pop(row.id, None)
            self._adopted.discard(row.id)
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join()

    def _run(self) -> None:
        while True:
            try:
                if not self._hand_some():
                    return
            except (OSError, sqlite3.Error) as exc:  # keep the thread; the rows stay on disk
                logger.warning("outbox: cannot read stored replies: %s", exc)
                with self._cond:
                    self._cond.wait(RETRY_S)

    def _hand_some(self) -> bool:
        """Hand the next rows to paho; False once stopping."""
        while True:
            with self._cond:
                self._cond.wait_for(self._should_hand, timeout=1.0)
                if self._stopping:
                    return False
                if not self._should_hand():
                    continue
                room = FLUSH_WINDOW - len(self._handed)
            rows = self._outbox.oldest(room, after=self._last_handed)
            for row in rows:
                with self._cond:
                    self._last_handed = row.id
                    if row.id in self._adopted:
                        continue
                    self._handed[row.id] = row
                self._publish(row)

    def _should_hand(self) -> bool:
        return self._stopping or (self._connected.is_set() and len(self._handed) < FLUSH_WINDOW
                                  and self._outbox.rows > len(self._handed) + len(self._adopted))
