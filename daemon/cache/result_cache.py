"""The result cache: an in-memory LRU (by bytes) in front of diskcache, free on a miss.

Keys (cache_key.py) are sha256 hex digests over the model's sha256 and its INT8 input
tensor (after preprocessing and quantizing, one sample). Values are the model's
dequantized float32 scores as read-only vectors, so `top_k` and labels are applied
after the cache and stay free to change.

The reply path only touches memory: a miss is one key digest plus one dict lookup
under one lock. Measured with scripts/bench_cache.py (timeit best of 5 and process CPU
time, 50x6 int8 input, 20k entries, AMD EPYC, CPython 3.11): make_key 1.25 us; a miss
(key + get_many) 2.2 us of CPU, well under the 5 us budget; a hit 2.2 us; put_many of
one vector 2.3 us. The disk (disk_tier.py) is written behind by one thread and
read only for models whose invoke costs more than a disk read.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional, Protocol, Sequence

import numpy as np

from daemon.cache.disk_tier import OFF, DiskTier, open_tier
from daemon.cache.memory_tier import MemoryLRU

logger = logging.getLogger(__name__)

_MIB = 1 << 20
REOPEN_INTERVAL_S = 60.0  # a disk tier that failed at start is tried again this often
_CLOSE_TIMEOUT_S = 5.0  # shutdown waits this long for queued disk writes, then gives up on them


def _frozen(scores: Any) -> np.ndarray:
    """A private read-only float32 copy: callers may reuse their buffers, readers share ours."""
    value = np.array(scores, dtype=np.float32)
    value.flags.writeable = False
    return value


class CacheSettings(Protocol):
    """What the cache reads of its config section (daemon.config.schema.CacheConfig)."""

    enabled: bool
    dir: Path
    max_mb: int
    ttl_s: float
    memory_mb: int


class ResultCache:
    """get_many/put_many of score vectors; thread-safe; never raises or waits on the disk.

    Starts a writer thread when the disk tier opens: call close() to flush and stop it.
    """

    def __init__(self, config: CacheSettings, disk: Any = None, clock: Callable[[], float] = time.monotonic,
                 reopen_s: float = REOPEN_INTERVAL_S):
        self._clock = clock
        self._ttl_s = config.ttl_s or math.inf
        self._lock = threading.Lock()  # guards the LRU and the counters below
        self._hits = self._disk_hits = self._misses = 0
        budget = config.memory_mb * _MIB if config.enabled else 0
        self._memory = MemoryLRU(budget) if budget > 0 else None
        self._disk: Optional[DiskTier] = None
        self._closed_disk: Optional[DiskTier] = None  # keeps its counters for snapshot()
        self._closing = threading.Event()
        self._reopener: Optional[threading.Thread] = None
        if config.enabled:
            self._disk = open_tier(config.dir, config.max_mb, config.ttl_s, disk)
            if self._disk is None and disk is None:
                self._reopener = threading.Thread(target=self._reopen, args=(config, reopen_s),
                                                  name="cache-reopen", daemon=True)
                self._reopener.start()
        if self._disk is not None and self._memory is not None:
            self._warm()

    def _reopen(self, config: CacheSettings, interval_s: float) -> None:
        """A disk that failed at start (full, unwritable, not yet mounted) is tried again now and then."""
        while not self._closing.wait(interval_s):
            disk = open_tier(config.dir, config.max_mb, config.ttl_s, report=False)
            if disk is not None:
                with self._lock:
                    self._disk = disk
                logger.info("cache %s opened on a retry: the disk tier works again", config.dir)
                return

    @property
    def enabled(self) -> bool:
        """Either tier works, or the disk may still come (it failed at start and is being retried)."""
        return self._memory is not None or self._disk is not None or self._reopener is not None

    def _warm(self) -> None:
        """Fill memory from disk, newest first, up to the memory budget."""
        assert self._disk is not None and self._memory is not None
        start, room = time.perf_counter(), [self._memory.budget]

        def fits(key: str, value: np.ndarray) -> bool:
            room[0] -= self._memory.size_of(key, value)
            return room[0] >= 0

        entries = self._disk.newest(fits)
        now = self._clock()
        with self._lock:
            for key, value, left in reversed(entries):  # oldest first, so the newest end up most recent
                self._memory.put(key, value, now + (math.inf if left is None else left))
        logger.info("cache warmed %s entries (%s bytes) from disk in %.3f s",
                    len(entries), self._memory.bytes, time.perf_counter() - start)

    def get_many(self, keys: Sequence[str], invoke_cost_s: float = 0.0) -> list[Optional[np.ndarray]]:
        """Memory; the disk for the misses only when invoke_cost_s (per sample) exceeds a disk read."""
        now = self._clock()
        memory = self._memory
        with self._lock:
            found = [memory.get(k, now) for k in keys] if memory is not None else [None] * len(keys)
            missing = [i for i, value in enumerate(found) if value is None]
            self._hits += len(found) - len(missing)
            self._misses += len(missing)
        disk = self._disk
        if missing and disk is not None and disk.readable and invoke_cost_s > disk.read_cost_s:
            self._read_disk(disk, keys, found, missing, now)
        return found

    def _read_disk(self, disk: DiskTier, keys: Sequence[str], found: list, missing: list[int], now: float) -> None:
        """Fill `found` from disk and promote what it had into memory."""
        for i in missing:
            value, left = disk.read(keys[i])
            if value is None:
                continue
            found[i] = value
            expires_at = min(now + self._ttl_s, now + (math.inf if left is None else left))
            with self._lock:
                self._disk_hits += 1
                self._misses -= 1
                if self._memory is not None:
                    self._memory.put(keys[i], value, expires_at)

    def put_many(self, items: Sequence[tuple[str, np.ndarray]]) -> None:
        """Into memory now; onto the disk later, by the writer thread."""
        if not items:
            return
        frozen = [(key, _frozen(scores)) for key, scores in items]
        if self._memory is not None:
            expires_at = self._clock() + self._ttl_s
            with self._lock:
                for key, value in frozen:
                    self._memory.put(key, value, expires_at)
        if self._disk is not None:
            self._disk.enqueue(frozen)

    def snapshot(self) -> dict:
        with self._lock:
            hits, disk_hits, misses = self._hits, self._disk_hits, self._misses
            entries = len(self._memory) if self._memory is not None else 0
            used = self._memory.bytes if self._memory is not None else 0
        disk = self._disk or self._closed_disk
        total = hits + disk_hits + misses
        return {"entries": entries, "bytes": used, "hits": hits, "disk_hits": disk_hits, "misses": misses,
                "hit_rate": (hits + disk_hits) / total if total else 0.0,
                "writes": disk.writes if disk else 0, "write_batches": disk.write_batches if disk else 0,
                "dropped_writes": disk.dropped_writes if disk else 0,
                "disk": self._disk.state if self._disk else OFF,
                "disk_read_us": round(disk.read_cost_s * 1e6, 1) if disk else None}

    def flush(self, timeout_s: float) -> bool:
        """Wait until writes queued so far are on disk; True when they are (or there is no disk)."""
        return self._disk.flush(timeout_s) if self._disk is not None else True

    def close(self) -> None:
        """Write what is queued (up to a time limit), stop the writer, close the disk."""
        self._closing.set()
        if self._reopener is not None:
            self._reopener.join(_CLOSE_TIMEOUT_S)
        with self._lock:
            disk, self._disk = self._disk, None
        if disk is not None:
            self._closed_disk = disk
            disk.close(_CLOSE_TIMEOUT_S)
