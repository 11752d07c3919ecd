"""The real diskcache: round trip, restart, TTL, refusing pickled rows, corrupt and unusable dirs."""

from __future__ import annotations

import os
import pickle
import sqlite3
import stat

import numpy as np

from daemon.cache import ResultCache, make_key
from daemon.config import CacheConfig


class Boom:
    ran = False

    def __reduce__(self):
        return (Boom._run, ())

    @staticmethod
    def _run():
        Boom.ran = True
        return "pwned"


def _config(path, **kw) -> CacheConfig:
    return CacheConfig(dir=path, **kw)


def test_round_trip_and_survives_reopen(tmp_path):
    cache = ResultCache(_config(tmp_path / "c"))
    cache.put("k1", [0.25, 0.75])
    assert cache.get("k1") == [0.25, 0.75] and cache.get("nope") is None
    cache.close()
    assert ResultCache(_config(tmp_path / "c")).get("k1") == [0.25, 0.75]
    assert stat.S_IMODE(os.stat(tmp_path / "c").st_mode) == 0o700


def test_key_depends_on_model_preprocessing_and_tensor():
    t = np.zeros((2, 3), np.float32)
    base = make_key("m1", "[]", t)
    assert base == make_key("m1", "[]", t.copy())
    assert len({base, make_key("m2", "[]", t), make_key("m1", "[{}]", t), make_key("m1", "[]", t + 1),
                make_key("m1", "[]", t.reshape(3, 2))}) == 5


def test_a_planted_pickle_row_is_refused_not_unpickled(tmp_path):
    cache = ResultCache(_config(tmp_path / "c"))
    cache.put("k", [1.0])
    cache.close()
    db = sqlite3.connect(tmp_path / "c" / "cache.db")
    db.execute("UPDATE Cache SET mode = 4, value = ? WHERE key = 'k'", (pickle.dumps(Boom()),))
    db.commit()
    db.close()
    reopened = ResultCache(_config(tmp_path / "c"))
    assert reopened.get("k") is None
    assert Boom.ran is False


def test_ttl_expires_entries(tmp_path):
    cache = ResultCache(_config(tmp_path / "c", ttl_s=0.001))
    cache.put("k", [1.0])
    cache._cache.expire(now=10**12)  # diskcache's own clock hook: far in the future
    assert cache.get("k") is None


def test_corrupt_database_is_quarantined_and_recreated(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "cache.db").write_bytes(b"this is not sqlite" * 100)
    cache = ResultCache(_config(tmp_path / "c"))
    assert cache.enabled
    cache.put("k", [1.0])
    assert cache.get("k") == [1.0]
    assert any(p.name.startswith("c.corrupt-") for p in tmp_path.iterdir())


def test_unusable_directory_serves_without_a_cache(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cache = ResultCache(_config(blocker / "sub"))
    assert not cache.enabled
    cache.put("k", [1.0])
    assert cache.get("k") is None
    assert "serving without a cache" in caplog.text


def test_disabled_cache_does_nothing(tmp_path):
    cache = ResultCache(CacheConfig(enabled=False, dir=tmp_path / "c"))
    cache.put("k", [1.0])
    assert cache.get("k") is None and not (tmp_path / "c").exists()


def test_failures_after_opening_degrade_to_misses_and_are_reported_once(tmp_path, caplog):
    cache = ResultCache(_config(tmp_path / "c"))
    cache.put("k", [1.0])
    for name in os.listdir(tmp_path / "c"):  # the database vanishes under the running daemon
        if name.startswith("cache.db"):
            (tmp_path / "c" / name).write_bytes(b"garbage" * 1000)
    for _ in range(3):
        cache.put("k2", [1.0])
        assert cache.get("k2") is None
    assert caplog.text.count("serving without it until it recovers") == 1


def test_an_unwritable_location_is_not_mistaken_for_corruption(tmp_path, caplog):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "cache.db").mkdir()  # sqlite cannot open a directory: OperationalError
    cache = ResultCache(_config(tmp_path / "c"))
    assert not cache.enabled
    assert (tmp_path / "c" / "cache.db").is_dir()  # left alone, not moved aside
    assert not any(p.name.startswith("c.corrupt-") for p in tmp_path.iterdir())
    assert "serving without a cache" in caplog.text
