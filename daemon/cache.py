"""On-disk result cache on diskcache, safe against pickled rows (CVE-2025-69872).

Keys are sha256 hex digests over (model sha256, canonical preprocessing, preprocessed
tensor bytes). Values are the model's dequantized scores as a JSON list, so `top_k`
and labels are applied after the cache and stay free to change.

diskcache unpickles any row whose mode says "pickle" on `get()`, even under its own
JSONDisk. `SafeJSONDisk` stores JSON bytes only and refuses to read a pickled row or key.
A cache that cannot be opened, read or written is reported once and the daemon serves
without it; a corrupt database is moved aside and recreated.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import time
from pathlib import Path
from typing import Optional, Sequence

import diskcache
import numpy as np
from diskcache.core import MODE_BINARY, MODE_RAW, UNKNOWN

from daemon.config import CacheConfig

logger = logging.getLogger(__name__)

_MIB = 1 << 20
_DIR_MODE = 0o700
_SQLITE_TIMEOUT_S = 1.0  # a busy database is a miss, not a stall on the hot path
_CACHE_ERRORS = (sqlite3.Error, OSError, diskcache.Timeout, ValueError, TypeError)


class UnsafeRowError(Exception):
    """A row or key in the cache database is not JSON (e.g. a planted pickle)."""


class SafeJSONDisk(diskcache.Disk):
    """A diskcache Disk that stores JSON as bytes and never unpickles."""

    def put(self, key):
        if type(key) is not str:
            raise TypeError("cache keys must be str digests")
        return key, True

    def get(self, key, raw):
        if not raw:
            raise UnsafeRowError("refusing a pickled cache key")
        return key

    def store(self, value, read, key=UNKNOWN):
        if read:
            raise TypeError("file-like cache values are not supported")
        return super().store(json.dumps(value, separators=(",", ":")).encode(), False, key=key)

    def fetch(self, mode, filename, value, read):
        if mode not in (MODE_RAW, MODE_BINARY) or read:
            raise UnsafeRowError(f"refusing a cache row stored in mode {mode}")
        return json.loads(super().fetch(mode, filename, value, False))


def make_key(model_sha256: str, tensor: np.ndarray) -> str:
    """sha256 over the model digest and its INT8 input tensor (one sample)."""
    digest = hashlib.sha256(model_sha256.encode())
    digest.update(repr(tensor.shape).encode())
    digest.update(np.ascontiguousarray(tensor).tobytes())
    return digest.hexdigest()


class ResultCache:
    """get/put of score vectors; every failure degrades to a miss, reported once."""

    def __init__(self, config: CacheConfig):
        self._config = config
        self._cache: Optional[diskcache.Cache] = None
        self._failing = False
        if config.enabled:
            self._cache = self._open(Path(config.dir))

    @property
    def enabled(self) -> bool:
        return self._cache is not None

    def _open(self, directory: Path) -> Optional[diskcache.Cache]:
        problem: Exception
        try:
            return self._open_dir(directory)
        except sqlite3.OperationalError as exc:  # locked, read-only, full: not corrupt, leave the files be
            problem = exc
        except sqlite3.DatabaseError as exc:  # "file is not a database": corrupt
            try:
                return self._recreate(directory, exc)
            except _CACHE_ERRORS as again:
                problem = again
        except _CACHE_ERRORS as exc:
            problem = exc
        logger.warning("cache %s cannot be opened (%s); serving without a cache", directory, problem)
        return None

    def _recreate(self, directory: Path, reason: Exception) -> diskcache.Cache:
        """Move a corrupt cache aside (kept for inspection) and start an empty one."""
        quarantine = directory.with_name(f"{directory.name}.corrupt-{int(time.time())}")
        logger.warning("cache %s is corrupt (%s); moved to %s and starting empty", directory, reason, quarantine)
        directory.rename(quarantine)
        return self._open_dir(directory)

    def _open_dir(self, directory: Path) -> diskcache.Cache:
        directory.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
        os.chmod(directory, _DIR_MODE)  # results may be sensitive; mkdir's mode obeys the umask
        cache = diskcache.Cache(str(directory), disk=SafeJSONDisk, timeout=_SQLITE_TIMEOUT_S,
                                size_limit=self._config.max_mb * _MIB,
                                eviction_policy="least-recently-stored")
        # Touch the tables: a corrupt file often opens fine and fails on first use.
        cache.get("\0probe")
        return cache

    def get(self, key: str) -> Optional[list[float]]:
        if self._cache is None:
            return None
        try:
            value = self._cache.get(key)
        except (*_CACHE_ERRORS, UnsafeRowError) as exc:
            self._report(exc, "read")
            return None
        self._recovered()
        return value if isinstance(value, list) else None

    def put(self, key: str, scores: Sequence[float]) -> None:
        if self._cache is None:
            return
        expire = self._config.ttl_s or None
        try:
            self._cache.set(key, [float(s) for s in scores], expire=expire)
        except _CACHE_ERRORS as exc:
            self._report(exc, "write")
            return
        self._recovered()

    def _report(self, exc: Exception, action: str) -> None:
        if not self._failing:
            logger.warning("cache %s failed (%s: %s); serving without it until it recovers",
                           action, type(exc).__name__, exc)
        self._failing = True

    def _recovered(self) -> None:
        if self._failing:
            logger.info("cache works again")
            self._failing = False

    def close(self) -> None:
        if self._cache is not None:
            self._cache.close()
            self._cache = None
