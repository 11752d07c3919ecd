"""daemon/fleet/node/fetch.py against real servers (tests/fleet/servers.py): nginx, http.server, a
proxy that cuts connections, a server that stalls; a real tmpfs for a full disk."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from daemon.fleet.node.fetch import FetchPolicy, fetch_file, fetch_small
from daemon.fleet.node.part import META_SUFFIX, PART_SUFFIX
from daemon.fleet.release.refusal import DOWNLOAD, NO_SPACE, OPERATOR, SHA256_MISMATCH, SIZE_MISMATCH, TOO_LARGE, Refused
from tests.fleet.servers import (BUSY_PATH, NGINX, OPENSSL, CuttingProxy, HttpServer, Nginx, ScriptedServer,
                                 make_certificates)

SIZE = 1 << 20
CUT = 300_000  # bytes (headers included) the proxy lets through before it cuts: mid-file
SMALL_DISK = "1m"
BIG = 2 << 20  # more than SMALL_DISK holds
CHUNK = 64 << 10
SEED = 20260412
ROOT = Path(__file__).resolve().parents[3]


def policy(**changes) -> FetchPolicy:
    """Quick to fail: no backoff, short timeouts, no free-space margin."""
    fields = dict(timeout_s=5.0, stall_s=5.0, attempts=3, backoff_s=0.0, max_backoff_s=0.0, max_bytes=64 << 20,
                  min_free_bytes=0)
    return FetchPolicy(**{**fields, **changes})


def publish(root: Path, name: str, size: int = SIZE, seed: int = SEED) -> tuple[bytes, str]:
    data = random.Random(seed).randbytes(size)
    (root / name).write_bytes(data)
    return data, hashlib.sha256(data).hexdigest()


def ranged(requests: list[dict]) -> list[dict]:
    """The requests that asked for a range (nginx logs a request when it ends: a cut one may come last)."""
    return [r for r in requests if r["range"]]


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.fixture
def site(tmp_path) -> Path:
    root = tmp_path / "site"
    root.mkdir()
    return root


@pytest.fixture
def incoming(tmp_path) -> Path:
    directory = tmp_path / "incoming"
    directory.mkdir()
    return directory


@pytest.fixture
def nginx(tmp_path, site):
    if NGINX is None:
        pytest.skip("nginx is not installed (apt-get install nginx-light)")
    work = tmp_path / "nginx"
    work.mkdir()
    with Nginx(work, site) as server:
        yield server


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs: a real full disk."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SMALL_DISK}", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {done.stderr.strip() or done.returncode}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


# --- whole, resumed, restarted ------------------------------------------------------------------


def test_a_whole_file_from_nginx_is_verified_renamed_and_reported(nginx, site, incoming):
    data, digest = publish(site, "model.tflite")
    seen = []
    fetch_file(nginx.url("model.tflite"), incoming / "model.tflite", SIZE, digest, policy(),
               progress=lambda done, total: seen.append((done, total)))
    assert (incoming / "model.tflite").read_bytes() == data
    assert leftovers(incoming) == ["model.tflite"]
    assert seen[-1] == (SIZE, SIZE)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert len(seen) <= SIZE // CHUNK + 1
    [request] = nginx.wait_requests(1)
    assert (request["status"], request["range"]) == ("200", "")  # escape=none: an absent header logs empty


def test_a_part_left_by_an_earlier_run_is_resumed_with_range_and_if_range(nginx, site, incoming):
    data, digest = publish(site, "model.tflite")
    dest = incoming / "model.tflite"
    with CuttingProxy(nginx.port, [CUT]) as proxy:
        with pytest.raises(Refused) as cut:
            fetch_file(proxy.url("model.tflite"), dest, SIZE, digest, policy(attempts=1))
    assert (cut.value.code, cut.value.final) == (DOWNLOAD, False)
    have = (incoming / f"model.tflite{PART_SUFFIX}").stat().st_size
    assert 0 < have < SIZE
    etag = json.loads((incoming / f"model.tflite{META_SUFFIX}").read_text())["validator"]

    fetch_file(nginx.url("model.tflite"), dest, SIZE, digest, policy())  # as after a restart: from disk
    assert dest.read_bytes() == data
    assert leftovers(incoming) == ["model.tflite"]
    [resumed] = ranged(nginx.wait_requests(2))
    assert resumed["status"] == "206"
    assert resumed["range"] == f"bytes={have}-"
    assert resumed["if_range"] == etag
    assert int(resumed["bytes"]) == SIZE - have


KILLED_MID_DOWNLOAD = """
import os, signal, sys
from pathlib import Path
from daemon.fleet.node.fetch import FetchPolicy, fetch_file
url, dest, size, digest = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def die(done, total):
    if done >= 2 * 64 * 1024:
        os.kill(os.getpid(), signal.SIGKILL)  # no cleanup of any kind: a power cut, as far as the part knows
fetch_file(url, dest, size, digest, FetchPolicy(min_free_bytes=0), progress=die)
"""


def test_a_daemon_killed_mid_download_resumes_where_the_disk_says(nginx, site, incoming):
    data, digest = publish(site, "model.tflite")
    dest = incoming / "model.tflite"
    child = subprocess.run([sys.executable, "-c", KILLED_MID_DOWNLOAD, nginx.url("model.tflite"), str(dest),
                            str(SIZE), digest], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert child.returncode == -signal.SIGKILL
    have = (incoming / f"model.tflite{PART_SUFFIX}").stat().st_size
    assert 0 < have < SIZE
    fetch_file(nginx.url("model.tflite"), dest, SIZE, digest, policy())
    assert dest.read_bytes() == data
    assert [r["range"] for r in ranged(nginx.wait_requests(2))] == [f"bytes={have}-"]


def test_a_cut_connection_is_resumed_by_the_next_attempt(nginx, site, incoming):
    data, digest = publish(site, "model.tflite")
    with CuttingProxy(nginx.port, [CUT]) as proxy:
        fetch_file(proxy.url("model.tflite"), incoming / "model.tflite", SIZE, digest, policy())
        assert (proxy.connections, proxy.cut) == (2, 1)
    assert (incoming / "model.tflite").read_bytes() == data
    [resumed] = ranged(nginx.wait_requests(2))
    assert resumed["status"] == "206"
    start = int(resumed["range"].removeprefix("bytes=").rstrip("-"))
    assert 0 < start < CUT and int(resumed["bytes"]) == SIZE - start


def test_a_file_changed_between_attempts_is_fetched_again_from_zero(nginx, site, incoming):
    publish(site, "model.tflite")
    new = random.Random(SEED + 1).randbytes(SIZE)
    new_digest = hashlib.sha256(new).hexdigest()

    def replace(_index: int) -> None:
        staged = site / "model.tflite.new"
        staged.write_bytes(new)
        later = time.time() + 100  # nginx's ETag is mtime (seconds) and size: make the mtime differ
        os.utime(staged, (later, later))
        os.replace(staged, site / "model.tflite")

    with CuttingProxy(nginx.port, [CUT], on_cut=replace) as proxy:
        fetch_file(proxy.url("model.tflite"), incoming / "model.tflite", SIZE, new_digest, policy())
    assert (incoming / "model.tflite").read_bytes() == new
    [second] = ranged(nginx.wait_requests(2))
    assert second["if_range"]
    assert second["status"] == "200" and int(second["bytes"]) == SIZE


def test_a_server_that_ignores_range_restarts_the_part_from_zero(tmp_path, site, incoming):
    data, digest = publish(site, "model.tflite")
    dest = incoming / "model.tflite"
    work = tmp_path / "http.server"
    work.mkdir()
    with HttpServer(work, site) as server:
        with CuttingProxy(server.port, [CUT]) as proxy:
            with pytest.raises(Refused):
                fetch_file(proxy.url("model.tflite"), dest, SIZE, digest, policy(attempts=1))
        have = (incoming / f"model.tflite{PART_SUFFIX}").stat().st_size
        validator = json.loads((incoming / f"model.tflite{META_SUFFIX}").read_text())["validator"]
        assert validator.endswith("GMT")  # http.server sends Last-Modified, no ETag
        seen = []
        fetch_file(server.url("model.tflite"), dest, SIZE, digest, policy(),
                   progress=lambda done, total: seen.append(done))
        lines = server.request_lines()
    assert dest.read_bytes() == data
    assert seen[0] < have  # counted from zero again: the 200 replaced the part
    assert len(lines) == 2 and all('" 200 ' in line for line in lines)


def test_a_part_of_another_file_is_not_resumed(nginx, site, incoming):
    data, digest = publish(site, "model.tflite")
    (incoming / f"model.tflite{PART_SUFFIX}").write_bytes(b"x" * 1000)
    (incoming / f"model.tflite{META_SUFFIX}").write_text(json.dumps(
        {"of": {"size": SIZE, "sha256": "1" * 64}, "validator": '"old"', "url": nginx.url("model.tflite")}))
    fetch_file(nginx.url("model.tflite"), incoming / "model.tflite", SIZE, digest, policy())
    assert (incoming / "model.tflite").read_bytes() == data
    assert [r["range"] for r in nginx.wait_requests(1)] == [""]


def test_a_file_already_in_place_is_not_fetched_again(nginx, site, incoming):
    data, digest = publish(site, "model.tflite")
    (incoming / "model.tflite").write_bytes(data)
    fetch_file(nginx.url("model.tflite"), incoming / "model.tflite", SIZE, digest, policy())
    assert nginx.requests() == []


def test_a_file_in_place_whose_bytes_changed_is_fetched_again(nginx, site, incoming):
    """The same size is not the same file: a byte changed on the SD card since the download (a
    restart before the release was admitted) is caught by the digest, and the file fetched again."""
    data, digest = publish(site, "model.tflite")
    changed = bytearray(data)
    changed[SIZE // 2] ^= 0x01
    (incoming / "model.tflite").write_bytes(bytes(changed))
    fetch_file(nginx.url("model.tflite"), incoming / "model.tflite", SIZE, digest, policy())
    assert (incoming / "model.tflite").read_bytes() == data
    assert [r["status"] for r in nginx.wait_requests(1)] == ["200"]


# --- refused ------------------------------------------------------------------------------------


def test_a_truncated_file_is_a_size_mismatch(nginx, site, incoming):
    _, digest = publish(site, "model.tflite", size=1000)
    with pytest.raises(Refused) as refused:
        fetch_file(nginx.url("model.tflite"), incoming / "model.tflite", 1100, digest, policy())
    assert (refused.value.code, refused.value.final) == (SIZE_MISMATCH, True)
    assert "1000" in refused.value.message and "1100" in refused.value.message
    assert leftovers(incoming) == []


def test_a_corrupt_file_is_a_sha256_mismatch_naming_both_digests(nginx, site, incoming):
    data, _ = publish(site, "model.tflite")
    claimed = hashlib.sha256(b"another file").hexdigest()
    with pytest.raises(Refused) as refused:
        fetch_file(nginx.url("model.tflite"), incoming / "model.tflite", SIZE, claimed, policy())
    assert refused.value.code == SHA256_MISMATCH
    assert hashlib.sha256(data).hexdigest()[:12] in refused.value.message and claimed[:12] in refused.value.message
    assert leftovers(incoming) == []


def test_a_file_bigger_than_the_manifest_says_is_a_size_mismatch(nginx, site, incoming):
    _, digest = publish(site, "model.tflite", size=2000)
    with pytest.raises(Refused) as refused:
        fetch_file(nginx.url("model.tflite"), incoming / "model.tflite", 1000, digest, policy())
    assert refused.value.code == SIZE_MISMATCH
    assert leftovers(incoming) == []


def test_a_file_bigger_than_max_bytes_is_too_large(nginx, site, incoming):
    _, digest = publish(site, "model.tflite", size=2000)
    with pytest.raises(Refused) as refused:
        fetch_file(nginx.url("model.tflite"), incoming / "model.tflite", 1000, digest, policy(max_bytes=1500))
    assert refused.value.code == TOO_LARGE
    assert leftovers(incoming) == []


def test_a_manifest_size_over_max_bytes_is_too_large_before_any_request(nginx, site, incoming):
    _, digest = publish(site, "model.tflite", size=2000)
    with pytest.raises(Refused) as refused:
        fetch_file(nginx.url("model.tflite"), incoming / "model.tflite", 2000, digest, policy(max_bytes=1500))
    assert refused.value.code == TOO_LARGE
    assert nginx.requests() == []


def test_a_body_longer_than_announced_nowhere_is_a_size_mismatch(incoming):
    body = random.Random(SEED).randbytes(2000)
    # HTTP/1.0 without Content-Length: the body ends when the server closes.
    with ScriptedServer(b"HTTP/1.0 200 OK\r\nContent-Type: application/octet-stream\r\n\r\n" + body) as server:
        with pytest.raises(Refused) as refused:
            fetch_file(server.url("model.tflite"), incoming / "model.tflite", 1000,
                       hashlib.sha256(body[:1000]).hexdigest(), policy())
    assert refused.value.code == SIZE_MISMATCH
    assert leftovers(incoming) == []


def test_a_404_is_final_at_once(nginx, incoming):
    started = time.monotonic()
    with pytest.raises(Refused) as refused:
        fetch_file(nginx.url("missing.tflite"), incoming / "missing.tflite", 1000, "0" * 64,
                   policy(attempts=5, backoff_s=30.0, max_backoff_s=30.0))
    assert (refused.value.code, refused.value.final) == (DOWNLOAD, True)
    assert "404" in refused.value.message and "missing.tflite" in refused.value.message
    assert time.monotonic() - started < 5.0  # no backoff was waited
    assert len(nginx.wait_requests(1)) == 1
    assert leftovers(incoming) == []


def test_a_5xx_is_retried_then_refused_naming_url_status_and_attempts(nginx, incoming):
    url = nginx.url(BUSY_PATH.lstrip("/"))
    with pytest.raises(Refused) as refused:
        fetch_file(url, incoming / "busy.bin", 1000, "0" * 64, policy(attempts=3))
    assert (refused.value.code, refused.value.final) == (DOWNLOAD, False)
    assert url in refused.value.message and "503" in refused.value.message and "3 attempts" in refused.value.message
    assert [r["status"] for r in nginx.wait_requests(3)] == ["503"] * 3


def test_a_server_that_stalls_fails_each_attempt_within_stall_s(incoming):
    stall_s, attempts = 0.3, 2
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nETag: \"x\"\r\n\r\n" + b"y" * 10
    with ScriptedServer(head, hold=True) as server:
        started = time.monotonic()
        with pytest.raises(Refused) as refused:
            fetch_file(server.url("model.tflite"), incoming / "model.tflite", 1000, "0" * 64,
                       policy(stall_s=stall_s, attempts=attempts))
        elapsed = time.monotonic() - started
        assert server.connections == attempts
    assert (refused.value.code, refused.value.final) == (DOWNLOAD, False)
    assert "timed out" in refused.value.message
    assert attempts * stall_s <= elapsed < attempts * stall_s + 3.0


def test_a_server_that_never_answers_fails_within_timeout_s(incoming):
    timeout_s = 0.3
    with ScriptedServer(b"", hold=True) as server:
        started = time.monotonic()
        with pytest.raises(Refused) as refused:
            fetch_file(server.url("model.tflite"), incoming / "model.tflite", 1000, "0" * 64,
                       policy(timeout_s=timeout_s, attempts=1))
        elapsed = time.monotonic() - started
    assert (refused.value.code, refused.value.final) == (DOWNLOAD, False)
    assert "timed out" in refused.value.message
    assert timeout_s <= elapsed < timeout_s + 3.0
    assert leftovers(incoming) == []


def test_the_wait_between_attempts_is_capped_by_max_backoff_s(nginx, incoming):
    started = time.monotonic()
    with pytest.raises(Refused):
        fetch_file(nginx.url(BUSY_PATH.lstrip("/")), incoming / "busy.bin", 1000, "0" * 64,
                   policy(attempts=3, backoff_s=60.0, max_backoff_s=0.05))
    assert time.monotonic() - started < 3.0


def test_cancel_during_the_wait_between_attempts_ends_it_at_once(nginx, incoming):
    cancel, outcome = threading.Event(), []

    def fetch() -> None:
        try:
            fetch_file(nginx.url(BUSY_PATH.lstrip("/")), incoming / "busy.bin", 1000, "0" * 64,
                       policy(attempts=3, backoff_s=60.0, max_backoff_s=60.0), cancel=cancel)
        except Refused as refused:
            outcome.append(refused.code)

    worker = threading.Thread(target=fetch)
    worker.start()
    nginx.wait_requests(1)  # the first attempt failed: it waits up to a minute now
    cancel.set()
    worker.join(5.0)
    assert not worker.is_alive() and outcome == [OPERATOR]
    assert len(nginx.requests()) < 3  # (a jittered wait may, rarely, be short enough for a second try)


def test_cancel_stops_at_the_next_chunk_and_keeps_the_part_for_later(nginx, site, incoming):
    data, digest = publish(site, "model.tflite")
    cancel = threading.Event()
    with pytest.raises(Refused) as refused:
        fetch_file(nginx.url("model.tflite"), incoming / "model.tflite", SIZE, digest, policy(),
                   progress=lambda done, total: cancel.set(), cancel=cancel)
    assert refused.value.code == OPERATOR
    have = (incoming / f"model.tflite{PART_SUFFIX}").stat().st_size
    assert 0 < have < SIZE
    fetch_file(nginx.url("model.tflite"), incoming / "model.tflite", SIZE, digest, policy(), cancel=threading.Event())
    assert (incoming / "model.tflite").read_bytes() == data
    assert [r["range"] for r in ranged(nginx.wait_requests(2))] == [f"bytes={have}-"]


def test_cancel_set_before_the_start_sends_no_request(nginx, site, incoming):
    _, digest = publish(site, "model.tflite")
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Refused) as refused:
        fetch_file(nginx.url("model.tflite"), incoming / "model.tflite", SIZE, digest, policy(), cancel=cancel)
    assert refused.value.code == OPERATOR
    assert nginx.requests() == []


def test_too_little_free_disk_is_no_space_before_a_byte_is_written(nginx, site, small_disk):
    _, digest = publish(site, "model.tflite", size=BIG)
    with pytest.raises(Refused) as refused:
        fetch_file(nginx.url("model.tflite"), small_disk / "model.tflite", BIG, digest, policy())
    assert (refused.value.code, refused.value.final) == (NO_SPACE, False)
    assert "free" in refused.value.message
    assert leftovers(small_disk) == []
    assert nginx.requests() == []


def test_a_disk_that_fills_while_writing_is_no_space_and_the_part_is_removed(nginx, site, small_disk):
    size = 600 << 10  # fits the empty tmpfs, so the check before the download passes
    _, digest = publish(site, "model.tflite", size=size)

    def fill(_done: int, _total: int) -> None:
        with open(small_disk / "filler", "ab") as filler:
            try:
                while True:
                    filler.write(b"\0" * CHUNK)
                    filler.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC

    with pytest.raises(Refused) as refused:
        fetch_file(nginx.url("model.tflite"), small_disk / "model.tflite", size, digest, policy(), progress=fill)
    assert (refused.value.code, refused.value.final) == (NO_SPACE, False)
    assert "filled up" in refused.value.message
    assert leftovers(small_disk) == ["filler"]


# --- small files --------------------------------------------------------------------------------


def test_fetch_small_reads_a_whole_small_file(nginx, site):
    data, _ = publish(site, "manifest.json", size=3000)
    assert fetch_small(nginx.url("manifest.json"), 4000, policy()) == data


def test_fetch_small_refuses_an_announced_length_over_its_cap(nginx, site):
    publish(site, "manifest.json", size=3000)
    with pytest.raises(Refused) as refused:
        fetch_small(nginx.url("manifest.json"), 2000, policy())
    assert refused.value.code == TOO_LARGE


def test_fetch_small_stops_reading_an_unannounced_body_at_its_cap():
    with ScriptedServer(b"HTTP/1.0 200 OK\r\n\r\n" + b"x" * 5000) as server:
        with pytest.raises(Refused) as refused:
            fetch_small(server.url("manifest.json"), 2000, policy())
    assert refused.value.code == TOO_LARGE


def test_fetch_small_404_is_final(nginx):
    with pytest.raises(Refused) as refused:
        fetch_small(nginx.url("manifest.json"), 2000, policy(attempts=4))
    assert (refused.value.code, refused.value.final) == (DOWNLOAD, True)
    assert len(nginx.wait_requests(1)) == 1


# --- HTTPS, headers -----------------------------------------------------------------------------


@pytest.fixture
def tls_nginx(tmp_path, site):
    """nginx with a certificate from a private CA; yields (server, the CA's file)."""
    if NGINX is None or OPENSSL is None:
        pytest.skip("nginx and openssl are needed (apt-get install nginx-light openssl)")
    work = tmp_path / "tls-nginx"
    work.mkdir()
    ca, cert, key = make_certificates(work)
    with Nginx(work, site, ssl_files=(cert, key)) as server:
        yield server, ca


def test_https_with_a_private_ca_and_extra_headers(tls_nginx, site, incoming):
    server, ca = tls_nginx
    data, digest = publish(site, "model.tflite")
    fetch_file(server.url("model.tflite"), incoming / "model.tflite", SIZE, digest,
               policy(ca_file=ca, headers={"Authorization": "Bearer s3cret"}))
    assert (incoming / "model.tflite").read_bytes() == data
    [request] = server.wait_requests(1)
    assert request["authorization"] == "Bearer s3cret"


def test_https_without_the_ca_is_final_at_once(tls_nginx, site, incoming):
    server, _ = tls_nginx
    _, digest = publish(site, "model.tflite")
    with pytest.raises(Refused) as refused:
        fetch_file(server.url("model.tflite"), incoming / "model.tflite", SIZE, digest, policy(attempts=5))
    assert (refused.value.code, refused.value.final) == (DOWNLOAD, True)
    assert "certificate" in refused.value.message
    assert leftovers(incoming) == []
