"""The result cache: an in-memory LRU (by bytes) in front of diskcache, free on a miss.

Keys (cache_key.py) are 128-bit blake2b digests over the model's sha256 and its INT8
input tensor (after preprocessing and quantizing, one sample). Values are the model's
dequantized float32 scores as read-only vectors, so `top_k` and labels are applied
after the cache and stay free to change. Each entry is one private copy of its scores,
shared by the memory tier and the disk queue.

What it pays for, and when:
- the reply path only touches memory: a miss is one key digest plus one dict lookup under
  one lock;
- a result is stored only for an input seen before (doorkeeper.py), so a stream that never
  repeats stores nothing: the first sighting is refused, the second admitted, the third hits;
- the disk (disk_tier.py) is read only for models whose invoke costs more than a disk read,
  and for the same reason only their results are written to it, behind, by one thread.
benchmarks/bench_cache.py measures it.
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
from daemon.cache.doorkeeper import Doorkeeper
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
        self._admitted = self._refused = 0
        self._doorkeeper = Doorkeeper()
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
        if self._disk is not None:
            self._remember_disk_keys(self._disk)
            if self._memory is not None:
                self._warm()

    def _reopen(self, config: CacheSettings, interval_s: float) -> None:
        """A disk that failed at start (full, unwritable, not yet mounted) is tried again now and then."""
        while not self._closing.wait(interval_s):
            disk = open_tier(config.dir, config.max_mb, config.ttl_s, report=False)
            if disk is not None:
                self._remember_disk_keys(disk)
                with self._lock:
                    self._disk = disk
                logger.info("cache %s opened on a retry: the disk tier works again", config.dir)
                return

    @property
    def enabled(self) -> bool:
        """Either tier works, or the disk may still come (it failed at start and is being retried)."""
        return self._memory is not None or self._disk is not None or self._reopener is not None

    def _remember_disk_keys(self, disk: DiskTier) -> None:
        """What a past run stored counts as seen: the disk is read for it on its first sighting."""
        keys = disk.newest_keys(self._doorkeeper.capacity - 1)  # one generation: no rotation forgets them
        with self._lock:
            for key in keys:
                self._doorkeeper.seen(key)

    def _warm(self) -> None:
        """Fill memory from disk, newest first, up to the memory budget."""
        assert self._disk is not None and self._memory is not None
        start, room = time.perf_counter(), [self._memory.budget]

        def fits(key: bytes, value: np.ndarray) -> bool:
            room[0] -= self._memory.size_of(key, value)
            return room[0] >= 0

        entries = self._disk.newest(fits)
        now = self._clock()
        with self._lock:
            for key, value, left in reversed(entries):  # oldest first, so the newest end up most recent
                self._memory.put(key, value, now + (math.inf if left is None else left))
        logger.info("cache warmed %s entries (%s bytes) from disk in %.3f s",
                    len(entries), self._memory.bytes, time.perf_counter() - start)

    def _disk_pays(self, invoke_cost_s: float) -> Optional[DiskTier]:
        """The disk tier when reading it costs less than running the model (per sample), else None."""
        disk = self._disk
        return disk if disk is not None and invoke_cost_s > disk.read_cost_s else None

    def get_many(self, keys: Sequence[bytes], invoke_cost_s: float = 0.0) -> list[Optional[np.ndarray]]:
        """Memory; the disk for the misses only when invoke_cost_s (per sample) exceeds a disk read."""
        now = self._clock()
        memory = self._memory
        with self._lock:
            found = [memory.get(k, now) for k in keys] if memory is not None else [None] * len(keys)
            missing = [i for i, value in enumerate(found) if value is None]
            self._hits += len(found) - len(missing)
            self._misses += len(missing)
        disk = self._disk_pays(invoke_cost_s) if missing else None
        if disk is not None and disk.readable:
            with self._lock:  # only what was seen before can have been stored: a new input costs no read
                missing = [i for i in missing if keys[i] in self._doorkeeper]
            if missing:
                self._read_disk(disk, keys, found, missing, now)
        return found

    def _read_disk(self, disk: DiskTier, keys: Sequence[bytes], found: list, missing: list[int], now: float) -> None:
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

    def put_many(self, items: Sequence[tuple[bytes, np.ndarray]], invoke_cost_s: float = 0.0) -> None:
        """The results of inputs seen before: into memory now, and onto the disk later (by the
        writer thread) when the model (invoke_cost_s per sample) costs more than a disk read.
        The others are only remembered, by the doorkeeper."""
        seen = self._doorkeeper.seen
        with self._lock:
            admitted = [(key, scores) for key, scores in items if seen(key)]
            self._admitted += len(admitted)
            self._refused += len(items) - len(admitted)
        if not admitted:
            return
        frozen = [(key, _frozen(scores)) for key, scores in admitted]
        if self._memory is not None:
            expires_at = self._clock() + self._ttl_s
            with self._lock:
                for key, value in frozen:
                    self._memory.put(key, value, expires_at)
        disk = self._disk_pays(invoke_cost_s)
        if disk is not None:
            disk.enqueue(frozen)

    def snapshot(self) -> dict:
        with self._lock:
            hits, disk_hits, misses = self._hits, self._disk_hits, self._misses
            admitted, refused = self._admitted, self._refused
            entries = len(self._memory) if self._memory is not None else 0
            used = self._memory.bytes if self._memory is not None else 0
        disk = self._disk or self._closed_disk
        total = hits + disk_hits + misses
        return {"entries": entries, "bytes": used, "hits": hits, "disk_hits": disk_hits, "misses": misses,
                "admitted": admitted, "refused": refused,
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
