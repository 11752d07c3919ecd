"""The two-tier result cache: admission, memory LRU semantics, write-behind to the real
diskcache (only for models worth it), restart warm-up, refusing pickled rows, corrupt and
unusable dirs, a disk that is slow or failing. Waits are event-driven with generous limits;
no sleeps guess timing."""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import sqlite3
import stat
import threading
import time

import diskcache
import numpy as np
import pytest

from daemon.cache.cache_key import KEY_BYTES, make_key, make_keys
from daemon.cache import disk_tier
from daemon.cache.disk_tier import DiskTier, SafeDisk, ScoreStore
from daemon.cache.result_cache import ResultCache
from daemon.config.schema import CacheConfig
from tests.fakes import FakeClock

WAIT_S = 30.0  # generous: only a broken writer ever waits this long
SHA = "ab" * 32
BIG = 100_000  # floats per vector: ~400 KB, so a 1 MiB memory tier holds two
COSTLY = 10.0  # seconds of invoke per sample: a model whose results are worth the disk


class Boom:
    ran = False

    def __reduce__(self):
        return (Boom._run, ())

    @staticmethod
    def _run():
        Boom.ran = True
        return "pwned"


class FakeDisk:
    """get/set_many/close in memory; set_many can block on `gate` or raise `fail`."""

    def __init__(self, gate: threading.Event | None = None):
        self.rows: dict = {}
        self.gets = self.transactions = 0
        self.gate, self.fail = gate, None
        self.entered = threading.Event()  # set when the writer is inside set_many()
        self.read_s, self.reads_wanted, self.read_enough = 0.0, 0, threading.Event()

    def get(self, key, expire_time=False):
        self.gets += 1
        if self.read_s:
            time.sleep(self.read_s)  # a stalled read, for the cost estimate
        if self.gets >= self.reads_wanted:
            self.read_enough.set()
        if self.fail:
            raise self.fail
        return self.rows.get(key), None

    def set_many(self, entries, expire):
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(WAIT_S)
        if self.fail:
            raise self.fail
        self.transactions += 1
        self.rows.update((key, scores.tobytes()) for key, scores in entries)

    def close(self):
        pass


def K(name: str) -> bytes:
    """A key as the daemon makes them: KEY_BYTES of digest."""
    return hashlib.blake2b(name.encode(), digest_size=KEY_BYTES).digest()


def _admit(cache: ResultCache, items, invoke_cost_s: float = COSTLY) -> None:
    """Offer the results twice: the first sighting is only remembered, the second stored."""
    cache.put_many(items, invoke_cost_s)
    cache.put_many(items, invoke_cost_s)


def _config(path, **kw) -> CacheConfig:
    return CacheConfig(dir=path, **kw)


def _vec(*values) -> np.ndarray:
    return np.array(values, np.float32)


def _row(*values) -> bytes:
    return _vec(*values).tobytes()


def _quantize(x: np.ndarray, scale: float = 0.1, zero_point: int = -3) -> np.ndarray:
    return np.clip(np.round(x / scale) + zero_point, -128, 127).astype(np.int8)


# --- keys --------------------------------------------------------------------------------

def test_key_depends_on_model_dtype_shape_and_bytes():
    t = np.arange(6, dtype=np.int8).reshape(2, 3)
    base = make_key("m1", t)
    assert base == make_key("m1", t.copy()) and type(base) is bytes and len(base) == KEY_BYTES
    assert len({base, make_key("m2", t), make_key("m1", t + 1), make_key("m1", t.reshape(3, 2)),
                make_key("m1", t.astype(np.uint8))}) == 5
    assert make_key("m1", t.T) == make_key("m1", np.ascontiguousarray(t.T))  # by value, not memory layout


def test_a_batchs_keys_are_its_rows_keys():
    batch = np.random.default_rng(0).integers(-128, 128, (5, 50, 6), dtype=np.int8)
    keys = make_keys(SHA, batch)
    assert keys == [make_key(SHA, row) for row in batch] and len(set(keys)) == 5
    assert make_keys(SHA, batch[::2]) == keys[::2]  # a gathered (strided) batch keys by value


def test_float_inputs_that_quantize_alike_share_a_key():
    a = np.array([[0.10, -0.52, 3.00]], np.float32)
    b = a + np.float32(0.004)  # well inside one quantization step of 0.1
    assert not np.array_equal(a, b)
    assert make_key(SHA, _quantize(a)) == make_key(SHA, _quantize(b))
    assert make_key(SHA, _quantize(a)) != make_key(SHA, _quantize(a + 0.1))


# --- memory tier --------------------------------------------------------------------------

def test_a_hit_returns_the_stored_vector_read_only_and_a_miss_none(tmp_path):
    cache = ResultCache(_config(tmp_path / "c"), disk=FakeDisk())
    scores = _vec(0.25, 0.75)
    _admit(cache, [(K("k1"), scores)])
    scores[0] = 9.0  # the caller's buffer is its own to reuse
    hit, miss = cache.get_many([K("k1"), K("nope")])
    assert hit.tolist() == [0.25, 0.75] and hit.dtype == np.float32 and not hit.flags.writeable
    assert miss is None
    snap = cache.snapshot()
    assert (snap["hits"], snap["misses"], snap["entries"], snap["hit_rate"]) == (1, 1, 1, 0.5)
    cache.close()


def test_lru_evicts_the_least_recently_used_by_bytes(tmp_path):
    cache = ResultCache(_config(tmp_path / "c", memory_mb=1), disk=FakeDisk())
    big = np.zeros(BIG, np.float32)
    _admit(cache, [(K("a"), big), (K("b"), big)])
    cache.get_many([K("a")])  # a is now more recent than b
    _admit(cache, [(K("c"), big)])
    assert [v is not None for v in cache.get_many([K("a"), K("b"), K("c")])] == [True, False, True]
    snap = cache.snapshot()
    assert snap["entries"] == 2 and 2 * big.nbytes < snap["bytes"] <= 1 << 20


def test_ttl_expires_memory_entries_on_the_injected_clock(tmp_path):
    clock = FakeClock()
    cache = ResultCache(_config(tmp_path / "c", ttl_s=10), disk=FakeDisk(), clock=clock)
    _admit(cache, [(K("k"), _vec(1.0))])
    clock.now = 9.9
    assert cache.get_many([K("k")])[0] is not None
    clock.now = 10.0
    assert cache.get_many([K("k")]) == [None] and cache.snapshot()["entries"] == 0


def test_ttl_zero_keeps_entries(tmp_path):
    clock = FakeClock()
    cache = ResultCache(_config(tmp_path / "c", ttl_s=0), disk=FakeDisk(), clock=clock)
    _admit(cache, [(K("k"), _vec(1.0))])
    clock.now = 1e12
    assert cache.get_many([K("k")])[0] is not None


# --- write-behind -------------------------------------------------------------------------

def test_a_slow_disk_never_delays_a_reply(tmp_path):
    gate = threading.Event()
    disk = FakeDisk(gate)
    cache = ResultCache(_config(tmp_path / "c"), disk=disk)
    _admit(cache, [(K("k1"), _vec(1.0))])
    assert disk.entered.wait(WAIT_S)  # the writer is now stuck inside the disk
    _admit(cache, [(K("k2"), _vec(2.0))])
    hits = cache.get_many([K("k1"), K("k2"), K("absent")], invoke_cost_s=10.0)
    assert not gate.is_set()  # both calls returned while the disk was still blocked
    assert [h is not None for h in hits] == [True, True, False]
    gate.set()
    assert cache.flush(WAIT_S)
    assert disk.rows == {K("k1"): _row(1.0), K("k2"): _row(2.0)}
    cache.close()


def test_writes_queued_while_the_writer_is_busy_land_in_one_transaction(tmp_path):
    gate = threading.Event()
    disk = FakeDisk(gate)
    cache = ResultCache(_config(tmp_path / "c"), disk=disk)
    _admit(cache, [(K("first"), _vec(0.0))])
    assert disk.entered.wait(WAIT_S)
    for i in range(20):
        _admit(cache, [(K(f"k{i}"), _vec(float(i)))])
    gate.set()
    assert cache.flush(WAIT_S)
    assert disk.transactions == 2 and len(disk.rows) == 21  # "first", then all 20 together
    snap = cache.snapshot()
    assert (snap["writes"], snap["write_batches"], snap["dropped_writes"]) == (21, 2, 0)
    cache.close()


def test_a_full_write_queue_drops_the_oldest_and_never_blocks():
    gate = threading.Event()
    disk = FakeDisk(gate)
    tier = DiskTier(disk, ttl_s=0, queue_max=2)
    tier.enqueue([(K("first"), _vec(0.0))])
    assert disk.entered.wait(WAIT_S)
    tier.enqueue([(K("a"), _vec(1.0)), (K("b"), _vec(2.0)), (K("c"), _vec(3.0))])
    assert not gate.is_set() and tier.dropped_writes == 1
    gate.set()
    assert tier.flush(WAIT_S)
    assert set(disk.rows) == {K("b"), K("c"), K("first")}
    tier.close(WAIT_S)


def test_the_disk_is_read_only_when_the_model_costs_more_than_a_read(tmp_path):
    disk = FakeDisk()
    disk.rows[K("k")] = _row(0.5, 0.5)
    cache = ResultCache(_config(tmp_path / "c"), disk=disk)  # a FakeDisk cannot be listed: nothing is warmed
    assert cache.get_many([K("k")], invoke_cost_s=COSTLY) == [None]  # never seen: it cannot have been stored
    cache.put_many([(K("k"), _vec(9.0))], invoke_cost_s=0.0)  # its first sighting: remembered, not stored
    gets, read_cost = disk.gets, cache.snapshot()["disk_read_us"] / 1e6
    assert cache.get_many([K("k")], invoke_cost_s=read_cost / 2) == [None] and disk.gets == gets
    assert cache.get_many([K("k")], invoke_cost_s=read_cost * 1000 + 1.0)[0].tolist() == [0.5, 0.5]
    assert disk.gets == gets + 1
    assert cache.get_many([K("k")], invoke_cost_s=10.0)[0] is not None and disk.gets == gets + 1  # promoted
    assert (cache.snapshot()["disk_hits"], cache.snapshot()["hits"]) == (1, 1) and disk.rows[K("k")] == _row(0.5, 0.5)


def test_a_stalled_read_counts_at_most_the_cap_and_an_idle_writer_corrects_the_estimate():
    disk = FakeDisk()
    disk.read_s = 0.05  # fifty times the cap
    tier = DiskTier(disk, ttl_s=0, probe_interval_s=0.01)
    assert tier.read_cost_s <= disk_tier._READ_COST_CAP_S  # the first (timed) read, at start
    disk.read_s = 0.0
    tier.read_cost_s = 1.0  # however high the estimate got, with nothing to write
    disk.reads_wanted = disk.gets + 31  # when the 31st starts, the 30 before it are in the estimate
    disk.read_enough.clear()
    assert disk.read_enough.wait(WAIT_S)  # the idle writer re-times reads on its own
    assert tier.read_cost_s < 0.01  # 0.8^30 of 1.0 at most, plus what the reads took
    tier.close(WAIT_S)


def test_disk_failures_are_reported_once_and_never_raise(tmp_path, caplog):
    disk = FakeDisk()
    cache = ResultCache(_config(tmp_path / "c", memory_mb=0), disk=disk)
    disk.fail = sqlite3.OperationalError("disk I/O error")
    for i in range(3):
        _admit(cache, [(K(f"k{i}"), _vec(1.0))])
        assert not cache.flush(WAIT_S)
        assert cache.get_many([K(f"k{i}")], invoke_cost_s=10.0) == [None]
    assert cache.snapshot()["disk"] == "failing"
    assert caplog.text.count("cache write failed") == 1 and caplog.text.count("cache read failed") == 1
    disk.fail = None
    _admit(cache, [(K("ok"), _vec(2.0))])
    assert cache.flush(WAIT_S) and cache.snapshot()["disk"] == "ok"
    assert cache.get_many([K("ok")], invoke_cost_s=10.0)[0].tolist() == [2.0]
    cache.close()


# --- the real diskcache -------------------------------------------------------------------

def test_a_restart_keeps_the_results_warm_in_memory(tmp_path):
    cache = ResultCache(_config(tmp_path / "c"))
    _admit(cache, [(K("k1"), _vec(0.25, 0.75))])
    cache.close()
    reopened = ResultCache(_config(tmp_path / "c"))
    assert reopened.get_many([K("k1")])[0].tolist() == [0.25, 0.75]  # invoke cost 0: memory only
    assert reopened.snapshot()["hits"] == 1
    assert stat.S_IMODE(os.stat(tmp_path / "c").st_mode) == 0o700
    reopened.close()


def test_a_restart_reads_the_disk_for_what_a_past_run_stored_at_its_first_sighting(tmp_path):
    cache = ResultCache(_config(tmp_path / "c", memory_mb=0))
    _admit(cache, [(K("k1"), _vec(0.25, 0.75))])
    cache.close()
    reopened = ResultCache(_config(tmp_path / "c", memory_mb=0))  # no memory tier: only the disk can answer
    assert reopened.get_many([K("k1"), K("new")], invoke_cost_s=COSTLY)[0].tolist() == [0.25, 0.75]
    assert reopened.snapshot()["disk_hits"] == 1
    reopened.close()


def test_warm_up_takes_the_newest_entries_up_to_the_memory_budget(tmp_path):
    cache = ResultCache(_config(tmp_path / "c", memory_mb=0))
    for key in (K("old"), K("mid"), K("new")):
        _admit(cache, [(key, np.full(BIG, 0.5, np.float32))])
    cache.close()
    reopened = ResultCache(_config(tmp_path / "c", memory_mb=1))
    assert [v is not None for v in reopened.get_many([K("old"), K("mid"), K("new")])] == [False, True, True]
    assert reopened.get_many([K("old")], invoke_cost_s=10.0)[0] is not None  # still on disk
    reopened.close()


def test_disk_entries_expire_with_the_ttl(tmp_path):
    cache = ResultCache(_config(tmp_path / "c", ttl_s=60, memory_mb=0))
    _admit(cache, [(K("k"), _vec(1.0))])
    cache.close()
    raw = diskcache.Cache(str(tmp_path / "c"), disk=SafeDisk)
    assert raw.expire(now=10**12) == 1  # diskcache's own clock hook: far in the future
    raw.close()
    assert ResultCache(_config(tmp_path / "c")).get_many([K("k")], invoke_cost_s=10.0) == [None]


def test_a_planted_pickle_row_is_refused_not_unpickled(tmp_path, caplog):
    cache = ResultCache(_config(tmp_path / "c"))
    _admit(cache, [(K("k"), _vec(1.0))])
    cache.close()
    db = sqlite3.connect(tmp_path / "c" / "cache.db")
    db.execute("UPDATE Cache SET mode = 4, value = ? WHERE key = ?", (pickle.dumps(Boom()), K("k")))
    db.commit()
    db.close()
    warmed = ResultCache(_config(tmp_path / "c"))  # warm-up reads every row
    assert warmed.get_many([K("k")]) == [None] and "refused 1 pickled rows" in caplog.text
    cold = ResultCache(_config(tmp_path / "c", memory_mb=0))  # the reply-path read
    assert cold.get_many([K("k")], invoke_cost_s=10.0) == [None]
    assert Boom.ran is False


def test_corrupt_database_is_quarantined_once_and_recreated(tmp_path):
    for generation in (1, 2):  # a second incident replaces the first copy: one quarantined copy, not one each
        (tmp_path / "c").mkdir(exist_ok=True)
        (tmp_path / "c" / "cache.db").write_bytes(b"this is not sqlite %d" % generation * 100)
        cache = ResultCache(_config(tmp_path / "c", memory_mb=0))
        assert cache.enabled and cache.snapshot()["disk"] == "ok"
        _admit(cache, [(K("k"), _vec(1.0))])
        assert cache.flush(WAIT_S)
        assert cache.get_many([K("k")], invoke_cost_s=10.0)[0].tolist() == [1.0]
        cache.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c", "c.corrupt"]
    assert (tmp_path / "c.corrupt" / "cache.db").read_bytes().startswith(b"this is not sqlite 2")  # the latest


def test_a_disk_that_fails_at_start_is_retried_and_comes_back(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="daemon.cache")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cache = ResultCache(_config(blocker / "sub"), reopen_s=0.05)
    assert cache.enabled and cache.snapshot()["disk"] == "off"
    _admit(cache, [(K("k"), _vec(1.0))])
    assert cache.get_many([K("k")])[0] is not None and cache.flush(WAIT_S)
    assert "serving without a disk cache" in caplog.text
    blocker.unlink()  # the operator frees the path
    for _ in range(int(WAIT_S / 0.05)):
        if cache.snapshot()["disk"] == "ok":
            break
        time.sleep(0.05)  # polling the retry thread; the limit only bounds a failing test
    assert cache.snapshot()["disk"] == "ok" and "works again" in caplog.text
    assert caplog.text.count("serving without a disk cache") == 1  # retries fail quietly
    cache.close()


def test_a_cache_dir_owned_by_someone_else_is_never_chmodded(tmp_path, caplog):
    if os.geteuid() != 0:
        pytest.skip("needs root to give the directory to another user")
    directory = tmp_path / "c"
    directory.mkdir(mode=0o755)
    os.chmod(directory, 0o755)
    os.chown(directory, 65534, 65534)  # nobody
    cache = ResultCache(_config(directory, memory_mb=0))
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o755
    assert "left as it is" in caplog.text
    cache.close()


def test_disabled_cache_does_nothing(tmp_path):
    cache = ResultCache(CacheConfig(enabled=False, dir=tmp_path / "c"))
    _admit(cache, [(K("k"), _vec(1.0))])
    assert not cache.enabled and cache.get_many([K("k")], invoke_cost_s=10.0) == [None]
    assert not (tmp_path / "c").exists()


def test_a_database_corrupted_under_the_daemon_degrades_and_is_reported_once(tmp_path, caplog):
    cache = ResultCache(_config(tmp_path / "c", memory_mb=0))
    _admit(cache, [(K("k"), _vec(1.0))])
    assert cache.flush(WAIT_S)
    for name in os.listdir(tmp_path / "c"):  # the database vanishes under the running daemon
        if name.startswith("cache.db"):
            (tmp_path / "c" / name).write_bytes(b"garbage" * 1000)
    for _ in range(3):
        _admit(cache, [(K("k2"), _vec(1.0))])
        assert not cache.flush(WAIT_S)
        assert cache.get_many([K("k2")], invoke_cost_s=10.0) == [None]
    assert caplog.text.count("cache write failed") == 1
    assert caplog.text.count("serving without it until it recovers") <= 2  # once per action at most


def test_an_unwritable_location_is_not_mistaken_for_corruption(tmp_path, caplog):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "cache.db").mkdir()  # sqlite cannot open a directory: OperationalError
    cache = ResultCache(_config(tmp_path / "c", memory_mb=0))
    assert cache.snapshot()["disk"] == "off"
    assert (tmp_path / "c" / "cache.db").is_dir()  # left alone, not moved aside
    assert not any(p.name.startswith("c.corrupt") for p in tmp_path.iterdir())
    cache.close()
    assert "serving without a disk cache" in caplog.text


def test_set_many_keeps_diskcaches_books(tmp_path):
    """ScoreStore.set_many writes diskcache's own table: its count, size limit and expiry hold."""
    store = ScoreStore(str(tmp_path / "c"), disk=SafeDisk, size_limit=1 << 20, cull_limit=10,
                       eviction_policy="least-recently-stored")
    rows = [(K(f"k{i}"), np.full(1000, float(i), np.float32)) for i in range(100)]  # 4 KB each
    store.set_many(rows[:50], expire=None)
    store.set_many(rows[:10], expire=None)  # again: updated in place, not added
    assert len(store) == 50 and store.check() == []
    value, expire_at = store.get(K("k3"), expire_time=True)
    assert np.frombuffer(value, "<f4").tolist() == [3.0] * 1000 and expire_at is None
    for start in range(50, 400, 50):  # ~1.6 MB in all, past the 1 MiB limit: the oldest are culled
        store.set_many([(K(f"k{i}"), np.full(1000, float(i), np.float32)) for i in range(start, start + 50)], None)
    assert store.volume() < 2 << 20 and len(store) < 350
    assert store.get(K("k399")) is not None and store.get(K("k0")) is None  # least recently stored go first
    store.set_many([(K("brief"), _vec(1.0))], expire=60)
    assert store.expire(now=10**12) == 1 and store.get(K("brief")) is None
    store.close()


def test_a_row_of_an_older_layout_is_skipped_at_warm_up(tmp_path):
    raw = diskcache.Cache(str(tmp_path / "c"))
    raw.set("ab" * 32, b"[1.0,2.0,3.]")  # a hex key from before the 16-byte digests (12 bytes: 3 floats)
    raw.close()
    cache = ResultCache(_config(tmp_path / "c"))
    assert cache.snapshot()["entries"] == 0
    cache.close()
