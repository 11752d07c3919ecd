"""The persistent tier behind the memory LRU: diskcache, kept off the reply path.

Keys are the 16-byte digests (cache_key.py), values the model's dequantized scores as
little-endian float32 bytes, stored in the row. diskcache unpickles any row whose mode
says "pickle" on `get()`, even under its own JSONDisk (CVE-2025-69872): `SafeDisk`
stores bytes only and refuses to read a pickled row or key.

Writes are write-behind: `enqueue` appends to a bounded queue and returns (past the
bound the oldest pending writes are dropped and counted: a cache may forget, it must
never make a reply wait), and ONE writer thread drains everything queued into ONE
transaction of ONE statement (`ScoreStore.set_many`: an upsert run over all the rows,
then diskcache's culling once), where `Cache.set` costs five statements a row.
Reads are timed into an EWMA, so the facade reads (and writes) the disk only for models
whose invoke costs more.

A directory that cannot be opened leaves the tier off; a corrupt database is moved aside
and recreated. Read and write failures are reported once per streak and degrade to
misses and lost writes; the writer's probe read after each drain notices recovery.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import stat
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import diskcache
import numpy as np
from diskcache.core import MODE_BINARY, MODE_RAW, UNKNOWN

from daemon.cache.cache_key import KEY_BYTES

logger = logging.getLogger(__name__)

_MIB = 1 << 20
_DIR_MODE = 0o700
_SQLITE_TIMEOUT_S = 1.0  # a busy database is a miss or a lost write, never a long stall
_WRITE_QUEUE_MAX = 4096  # pending writes; a burst beyond this loses its oldest cache writes
_COST_EWMA_WEIGHT = 0.2  # weight of the newest read in the disk read cost estimate
# A read slower than this counts as this slow in the estimate: one stalled read (a busy database
# waits up to _SQLITE_TIMEOUT_S) must not make every model look cheaper than the disk for minutes,
# and a model slower than this is worth the disk however slow it is.
_READ_COST_CAP_S = 0.001
# The writer re-times a read this often when it has nothing to write: the disk is written only for
# models that cost more than a read, so without it a high estimate would never be corrected.
_PROBE_INTERVAL_S = 5.0
_WARM_LIMIT_S = 2.0  # a huge cache must not hold start-up hostage
_PROBE_KEY = b"\0probe"  # never a real key (those are KEY_BYTES long)
_SCORE_DTYPE = np.dtype("<f4")
_QUARANTINE_SUFFIX = ".corrupt"
_GROUP_OTHER_BITS = 0o077

OFF, OK, FAILING = "off", "ok", "failing"

Entry = tuple[bytes, np.ndarray]


class UnsafeRowError(Exception):
    """A row or key in the cache database is not plain bytes (e.g. a planted pickle)."""


_CACHE_ERRORS = (sqlite3.Error, OSError, diskcache.Timeout, ValueError, TypeError)
_READ_ERRORS = (*_CACHE_ERRORS, UnsafeRowError)


class SafeDisk(diskcache.Disk):
    """A diskcache Disk that keeps bytes keys and bytes values, and never unpickles."""

    def put(self, key):
        if type(key) is not bytes:
            raise TypeError("cache keys must be bytes digests")
        return sqlite3.Binary(key), True

    def get(self, key, raw):
        if not raw:
            raise UnsafeRowError("refusing a pickled cache key")
        return bytes(key) if isinstance(key, (memoryview, bytes)) else key

    def store(self, value, read, key=UNKNOWN):
        if read or type(value) is not bytes:
            raise TypeError("cache values must be bytes")
        return super().store(value, False, key=key)

    def fetch(self, mode, filename, value, read):
        if mode not in (MODE_RAW, MODE_BINARY) or read:
            raise UnsafeRowError(f"refusing a cache row stored in mode {mode}")
        return super().fetch(mode, filename, value, False)


# One row per entry in diskcache's own table, its value in the row (never a file: scores are
# small), so `Cache.get`, `expire` and the size limit see them as their own. ON CONFLICT needs
# SQLite 3.24 (2018); its UPDATE fires diskcache's size trigger as `Cache.set`'s UPDATE does.
_UPSERT = ("INSERT INTO Cache(key, raw, store_time, expire_time, access_time, access_count, tag, size, mode,"
           " filename, value) VALUES (?, 1, ?, ?, ?, 0, NULL, 0, ?, NULL, ?)"
           " ON CONFLICT(key, raw) DO UPDATE SET store_time = excluded.store_time,"
           " expire_time = excluded.expire_time, access_time = excluded.access_time, access_count = 0,"
           " size = 0, mode = excluded.mode, filename = NULL, value = excluded.value")


class ScoreStore(diskcache.Cache):
    """diskcache with `set_many`: a batch of rows in one transaction, one statement, one cull.

    It uses diskcache's `_transact`, `_con` and `_cull` (5.6: pinned `<6` in pyproject.toml), and the test
    tests/cache/test_cache.py::test_set_many_keeps_diskcaches_books checks it against the
    real diskcache: count, volume, the size limit and expiry."""

    def set_many(self, entries: Sequence[Entry], expire: Optional[float]) -> None:
        now = time.time()
        expire_at = None if expire is None else now + expire
        rows = [(sqlite3.Binary(key), now, expire_at, now, MODE_RAW,
                 sqlite3.Binary(scores.astype(_SCORE_DTYPE, copy=False).tobytes())) for key, scores in entries]
        with self._transact() as (sql, cleanup):
            self._con.executemany(_UPSERT, rows)
            self._cull(now, sql, cleanup, limit=self.cull_limit * len(rows))


def open_disk(directory: Path, max_mb: int, report: bool = True) -> Optional[ScoreStore]:
    """The diskcache at `directory`, or None (reported unless `report` is False) when it cannot be used."""
    problem: Exception
    try:
        return _open_dir(directory, max_mb)
    except sqlite3.OperationalError as exc:  # locked, read-only, full: not corrupt, leave the files be
        problem = exc
    except sqlite3.DatabaseError as exc:  # "file is not a database": corrupt
        try:
            return _recreate(directory, max_mb, exc)
        except _CACHE_ERRORS as again:
            problem = again
    except _CACHE_ERRORS as exc:
        problem = exc
    (logger.warning if report else logger.debug)("cache %s cannot be opened (%s); serving without a disk "
                                                 "cache and retrying now and then", directory, problem)
    return None


def _recreate(directory: Path, max_mb: int, reason: Exception) -> ScoreStore:
    """Keep the corrupt cache for inspection (one copy: a newer one replaces it) and start empty.

    The copy is the sibling `<dir>.corrupt`; when the directory is a mountpoint (or cannot be
    renamed) its files move into `<dir>/.corrupt` instead and the cache is recreated in place."""
    quarantine = directory.with_name(f"{directory.name}{_QUARANTINE_SUFFIX}")
    if os.path.ismount(directory) or not _replace_dir(directory, quarantine):
        quarantine = directory / _QUARANTINE_SUFFIX
        shutil.rmtree(quarantine, ignore_errors=True)
        quarantine.mkdir(mode=_DIR_MODE)
        for entry in list(directory.iterdir()):
            if entry != quarantine:
                entry.rename(quarantine / entry.name)
    logger.warning("cache %s is corrupt (%s); kept as %s, starting empty", directory, reason, quarantine)
    return _open_dir(directory, max_mb)


def _replace_dir(directory: Path, quarantine: Path) -> bool:
    shutil.rmtree(quarantine, ignore_errors=True)
    try:
        directory.rename(quarantine)
    except OSError:  # e.g. EBUSY on a mountpoint that os.path.ismount did not see
        return False
    return True


def _open_dir(directory: Path, max_mb: int) -> ScoreStore:
    directory.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
    _keep_private(directory)
    cache = ScoreStore(str(directory), disk=SafeDisk, timeout=_SQLITE_TIMEOUT_S,
                            size_limit=max_mb * _MIB, eviction_policy="least-recently-stored",
                            sqlite_mmap_size=0)  # reads by pread: no file-backed RSS growing to 64 MB (soak)
    # Touch the tables: a corrupt file often opens fine and fails on first use.
    cache.get(_PROBE_KEY)
    return cache


def _keep_private(directory: Path) -> None:
    """0700 for a directory we own (mkdir's mode obeys the umask); never chmod someone else's."""
    info = directory.stat()
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid == os.geteuid():
        if mode != _DIR_MODE:
            os.chmod(directory, _DIR_MODE)
    elif mode & _GROUP_OTHER_BITS:
        logger.warning("cache %s belongs to uid %d with mode %o: left as it is, so others may read the "
                       "cached results; make it the service user's, mode 0700", directory, info.st_uid, mode)


def as_scores(value: Any) -> Optional[np.ndarray]:
    """A stored row's bytes -> a read-only float32 vector; anything else is a miss."""
    if type(value) is not bytes or not value or len(value) % _SCORE_DTYPE.itemsize:
        return None
    return np.frombuffer(value, _SCORE_DTYPE)  # read-only: a view of immutable bytes


class _Health:
    """One warning per failure streak of one action, however many threads hit it."""

    def __init__(self, action: str):
        self.action = action
        self.failing = False
        self._lock = threading.Lock()

    def failed(self, exc: BaseException) -> None:
        with self._lock:
            first, self.failing = not self.failing, True
        if first:
            logger.warning("cache %s failed (%s: %s); serving without it until it recovers",
                           self.action, type(exc).__name__, exc)

    def worked(self) -> None:
        if self.failing:  # unlocked read: the common case stays a single attribute check
            with self._lock:
                was, self.failing = self.failing, False
            if was:
                logger.info("cache %s works again", self.action)


class DiskTier:
    """Timed reads on the caller's thread; writes queued for one writer thread."""

    def __init__(self, disk: Any, ttl_s: float, queue_max: int = _WRITE_QUEUE_MAX,
                 probe_interval_s: float = _PROBE_INTERVAL_S):
        self._disk = disk
        self._probe_interval_s = probe_interval_s
        self._expire = ttl_s or None
        self._queue_max = queue_max
        self._reads, self._writes = _Health("read"), _Health("write")
        self.read_cost_s = 0.0
        self.read(_PROBE_KEY)  # seeds the cost estimate
        self._cond = threading.Condition()
        self._pending: deque[Entry] = deque()
        self._queued = self._done = 0  # items ever queued / ever written, failed or dropped
        self._stopping = False
        self.writes = self.write_batches = self.dropped_writes = 0
        self._thread = threading.Thread(target=self._run, name="cache-writer", daemon=True)
        self._thread.start()

    @property
    def state(self) -> str:
        return FAILING if self._reads.failing or self._writes.failing else OK

    @property
    def readable(self) -> bool:
        return not self._reads.failing

    def _timed_get(self, key: bytes) -> tuple[Any, Optional[float]]:
        start = time.perf_counter()
        try:
            return self._disk.get(key, expire_time=True)
        finally:
            # Races between reader threads lose an update at worst: it is an estimate.
            took = min(time.perf_counter() - start, _READ_COST_CAP_S)
            self.read_cost_s += _COST_EWMA_WEIGHT * (took - self.read_cost_s)

    def read(self, key: bytes) -> tuple[Optional[np.ndarray], Optional[float]]:
        """(scores or None, seconds left to live or None for never); failures are misses."""
        try:
            value, expire_at = self._timed_get(key)
        except _READ_ERRORS as exc:
            self._reads.failed(exc)
            return None, None
        self._reads.worked()
        return as_scores(value), None if expire_at is None else expire_at - time.time()

    def newest(self, fits: Callable[[bytes, np.ndarray], bool]) -> list[tuple[bytes, np.ndarray, Optional[float]]]:
        """Live entries, newest stored first, while `fits` says they fit and time allows."""
        try:
            keys = reversed(self._disk)  # diskcache: rowid order, i.e. newest inserted first
        except TypeError:
            return []  # a disk without ordered iteration starts cold
        out: list[tuple[bytes, np.ndarray, Optional[float]]] = []
        deadline, refused = time.monotonic() + _WARM_LIMIT_S, 0
        try:
            for key in keys:
                if type(key) is not bytes or len(key) != KEY_BYTES:
                    continue  # not one of ours (a row of an older layout: it ages out)
                try:
                    value, expire_at = self._timed_get(key)
                except UnsafeRowError:  # one planted row is not a failing disk
                    refused += 1
                    continue
                scores = as_scores(value)
                if scores is None or (expire_at is not None and expire_at <= time.time()):
                    continue
                if not fits(key, scores) or time.monotonic() > deadline:
                    break
                out.append((key, scores, None if expire_at is None else expire_at - time.time()))
        except _READ_ERRORS as exc:  # iteration itself failed (e.g. a pickled key): keep what we have
            self._reads.failed(exc)
        if refused:
            logger.warning("cache warm-up refused %s pickled rows (planted?)", refused)
        return out

    def newest_keys(self, limit: int) -> list[bytes]:
        """Up to `limit` keys, newest stored first (keys only: no row is read)."""
        keys: list[bytes] = []
        try:
            for key in reversed(self._disk):  # diskcache: rowid order, i.e. newest inserted first
                if len(keys) >= limit:
                    break
                if type(key) is bytes and len(key) == KEY_BYTES:
                    keys.append(key)
        except TypeError:  # a disk without ordered iteration
            pass
        except _READ_ERRORS as exc:  # e.g. a pickled key: keep what we have
            self._reads.failed(exc)
        return keys

    def enqueue(self, items: Sequence[Entry]) -> None:
        """Queue writes for the writer thread; never waits for the disk."""
        with self._cond:
            if self._stopping:
                return
            self._pending.extend(items)
            self._queued += len(items)
            over = len(self._pending) - self._queue_max
            for _ in range(over):
                self._pending.popleft()
            if over > 0:
                self.dropped_writes += over
                self._done += over
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._stopping, timeout=self._probe_interval_s)
                if self._stopping and not self._pending:
                    return  # everything queued is written
                batch, self._pending = self._pending, deque()
            if not batch:  # idle: re-time a read (and notice a disk that recovered)
                self.read(_PROBE_KEY)
                continue
            written = self._write(batch)
            self.read(batch[-1][0] if written else _PROBE_KEY)  # refresh the cost, notice recovery
            with self._cond:
                self.writes += written
                self.write_batches += bool(written)
                self._done += len(batch)
                self._cond.notify_all()

    def _write(self, batch: deque[Entry]) -> int:
        """Everything queued in one transaction; the number written."""
        try:
            self._disk.set_many(batch, self._expire)
        except Exception as exc:  # the writer must outlive any failure: all of them mean "disk failing"
            self._writes.failed(exc)
            return 0
        self._writes.worked()
        return len(batch)

    def flush(self, timeout_s: float) -> bool:
        """Wait until what was queued before the call is written; False on timeout or failure."""
        with self._cond:
            target = self._queued
            reached = self._cond.wait_for(lambda: self._done >= target, timeout=timeout_s)
        return reached and not self._writes.failing

    def close(self, timeout_s: float) -> None:
        """Let the writer drain what is queued, then stop it and close the disk."""
        with self._cond:
            self._stopping = True
            pending = len(self._pending)
            self._cond.notify_all()
        self._thread.join(timeout_s)
        if self._thread.is_alive():  # the disk is stuck: leave it open under the (daemon) writer
            logger.warning("cache writer still busy after %s s; up to %s queued writes lost", timeout_s, pending)
            return
        try:
            self._disk.close()
        except _CACHE_ERRORS as exc:
            logger.warning("cache close failed (%s)", exc)


def open_tier(directory: Path, max_mb: int, ttl_s: float, disk: Any = None,
              report: bool = True) -> Optional[DiskTier]:
    """The disk tier on `disk` (tests) or on the diskcache at `directory`; None when unusable."""
    if disk is None:
        disk = open_disk(directory, max_mb, report)
    return None if disk is None else DiskTier(disk, ttl_s)
