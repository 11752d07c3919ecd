"""The disk cache on a full filesystem: a 2 MB tmpfs as cache.dir (needs root and mount).

Full before start, filled while serving, then freed: every request is still answered
(memory tier and inference), each failure episode is logged once, and the recovery once.
The route serves `appliance_large` (MiniRocket, ~7.5 ms a trace): the disk tier holds only
the results of a model whose invoke costs more than a disk read, and this one does by a
hundred times, whatever else the machine runs (the bundled `appliance`, ~40 µs a sample, was
within the noise of a disk read, so whether it wrote to disk at all depended on the minute).
Each input is sent twice, since the cache stores a result only for an input seen before.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.integration.conftest import LARGE_MODELS, LARGE_ROUTE, ROOT, Client, burst, write_config

TMPFS_SIZE = "2m"
_CHUNK = b"\0" * 65536
_NOISE_STD = 2.0  # sensor units: each request quantizes to a new input, a new cache entry


@pytest.fixture
def small_fs(tmp_path):
    mountpoint = tmp_path / "cachefs"
    mountpoint.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(mountpoint)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    yield mountpoint
    subprocess.run(["umount", "-l", str(mountpoint)], check=False)


def fill(directory: Path, leave_bytes: int = 0) -> Path:
    """A file that takes the filesystem's free space, all of it or all but `leave_bytes`."""
    filler = directory / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                free = os.statvfs(directory)
                room = free.f_bavail * free.f_frsize - leave_bytes
                if room <= 0:
                    break
                f.write(_CHUNK[: min(len(_CHUNK), room)])
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return filler


def requests(n: int, seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    with np.load(ROOT / "models/appliance/test.npz") as data:
        x = data["x"]
    rows = x[np.arange(n) % len(x)] + rng.normal(0.0, _NOISE_STD, (n, *x.shape[1:]))
    return [json.dumps({"id": i, "data": np.round(r, 2).tolist()}).encode() for i, r in enumerate(rows)]


def serve_all(client, topic: str, reply_topic: str, payloads: list[bytes]) -> None:
    before = len(client.on(reply_topic))
    burst(client, topic, payloads)
    replies = [json.loads(m.payload) for m in client.wait_count(reply_topic, before + len(payloads))[before:]]
    assert sorted(r["id"] for r in replies) == list(range(len(payloads)))
    assert all("label" in r for r in replies)


def serve_twice(client, topic: str, reply_topic: str, payloads: list[bytes]) -> None:
    """Each input seen, then seen again: the second sighting is stored (and written to disk)."""
    serve_all(client, topic, reply_topic, payloads)
    serve_all(client, topic, reply_topic, payloads)


def large_model_config(tmp_path: Path, cache_dir: Path) -> Path:
    return write_config(tmp_path, cache={"dir": str(cache_dir)}, models=LARGE_MODELS, routes=[LARGE_ROUTE])


def test_a_full_cache_disk_costs_no_reply_and_each_episode_is_logged_once(tmp_path, small_fs, broker, start_daemon):
    config = large_model_config(tmp_path, small_fs / "cache")
    # (a) full before start: the disk tier cannot open; memory and inference serve everything.
    filler = fill(small_fs)
    client = Client(broker)
    first = start_daemon(config, wait_online=client)
    client.subscribe("results/d1/appliance")
    serve_twice(client, "plugs/d1/power", "results/d1/appliance", requests(25, seed=1))
    assert first.stop() == 0
    assert first.log().count("cannot be opened") == 1, first.log()
    client.close()
    filler.unlink()
    # (b) room at start, then full while serving: the cache writes fail, the replies do not.
    client = Client(broker)
    second = start_daemon(config, wait_online=client)
    client.subscribe("results/d2/appliance")
    filler = fill(small_fs)
    serve_twice(client, "plugs/d2/power", "results/d2/appliance", requests(150, seed=2))
    assert second.wait_for_log("cache write failed"), second.log()[-3000:]
    serve_twice(client, "plugs/d2/power", "results/d2/appliance", requests(50, seed=3))
    # (c) space freed: the next writes work, and say so once.
    filler.unlink()
    serve_twice(client, "plugs/d2/power", "results/d2/appliance", requests(50, seed=4))
    assert second.wait_for_log("cache write works again"), second.log()[-3000:]
    client.close()
    assert second.stop() == 0
    log = second.log()
    assert log.count("cache write failed") == 1 and log.count("cache write works again") == 1, log
    assert "Traceback" not in log, log
