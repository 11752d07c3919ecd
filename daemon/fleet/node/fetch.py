"""A release's files over HTTP(S), on the agent's background thread while the old model serves.

`fetch_small` reads a manifest or its signatures whole (capped). `fetch_file` streams one file
into `<dest>.part`, through sha256, and renames it to `dest` only once it is complete and its
digest is the manifest's. A download resumes: across attempts (the part and its running
hash stay in memory) and across a daemon restart (the part stays on disk, and beside it
`<dest>.part.meta` keeps the server's validator, so the next request asks `Range: bytes=N-` with
`If-Range: <validator>`: a 206 appends, a 200, from a server that ignores Range or whose file
changed, starts again from zero).

Standard library only (http.client): with it the socket is ours, so connecting and waiting for
the headers is bounded by `timeout_s` and the body by `stall_s` per read.
"""

from __future__ import annotations

import http.client
import logging
import random
import shutil
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Optional, TypeVar
from urllib.parse import urljoin, urlsplit

from daemon.fleet.node.part import CHUNK_BYTES, PART_SUFFIX, Part, hash_file
from daemon.fleet.release.refusal import DOWNLOAD, NO_SPACE, OPERATOR, SIZE_MISMATCH, TOO_LARGE, Refused

logger = logging.getLogger(__name__)

T = TypeVar("T")
# progress() is called when this much more has arrived (and at the end): often enough for the
# reported document, rarely enough not to publish per read.
PROGRESS_BYTES = 64 << 10
MAX_REDIRECTS = 5
REDIRECTS = (301, 302, 303, 307, 308)
# 4xx answers a later attempt may get past (a timeout on the server's side, a rate limit).
RETRIED_4XX = (408, 429)
RANGE_NOT_SATISFIABLE = 416
_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class FetchPolicy:
    """How releases are downloaded (config: `fleet.fetch`, daemon/lifecycle/fleet_node.py)."""

    timeout_s: float = 10.0
    """Connecting, and waiting for the response's headers, at most this long."""
    stall_s: float = 30.0
    """No byte of the body for this long: the attempt fails (and the next one resumes)."""
    attempts: int = 5
    """Tries per file; a 4xx answer (but 408 and 429) is final at once."""
    backoff_s: float = 2.0
    """The first wait between attempts; it doubles each time, with full jitter."""
    max_backoff_s: float = 60.0
    """The wait between attempts at most."""
    max_bytes: int = 256 << 20
    """A file (or a release) larger than this is refused: `too_large`."""
    min_free_bytes: int = 64 << 20
    """Free disk a download must leave: `no_space` otherwise."""
    ca_file: Optional[Path] = None
    """CA bundle for an HTTPS server with a private CA (None: the system's CAs)."""
    headers: Mapping[str, str] = field(default_factory=dict, hash=False)
    """Sent with every request (e.g. Authorization)."""


class _Transient(Exception):
    """An attempt failed in a way that a later one may get past (a 5xx, a cut connection)."""


def fetch_small(url: str, max_bytes: int, policy: FetchPolicy) -> bytes:
    """The whole body of `url` (a manifest, its signatures), at most `max_bytes`: a larger one is
    refused `too_large` without being read past the cap. Retried like `fetch_file`."""
    def attempt() -> bytes:
        conn, resp = _open(url, policy, {})
        try:
            _check_status(url, resp)
            length = _content_length(resp)
            if length is not None and length > max_bytes:
                raise Refused(TOO_LARGE, f"{url} is {length} bytes, more than the {max_bytes} allowed")
            return _read_capped(url, resp, max_bytes, length)
        finally:
            resp.close()
            conn.close()
    return _with_retries(url, policy, None, attempt)


def _read_capped(url: str, resp: http.client.HTTPResponse, max_bytes: int, length: Optional[int]) -> bytes:
    data = bytearray()
    while True:
        chunk = resp.read1(CHUNK_BYTES)
        if not chunk:
            break
        data += chunk
        if len(data) > max_bytes:
            raise Refused(TOO_LARGE, f"{url} sent more than the {max_bytes} bytes allowed")
    if length is not None and len(data) < length:
        raise _Transient(f"the connection closed after {len(data)} of {length} bytes")
    return bytes(data)


def fetch_file(url: str, dest: Path, size: int, sha256: str, policy: FetchPolicy,
               progress: Optional[Callable[[int, int], None]] = None,
               cancel: Optional[threading.Event] = None) -> None:
    """Download `url` to `dest` (`size` bytes whose sha256 is `sha256`), resuming `dest.part`.

    Refused: `too_large`, `size_mismatch`, `sha256_mismatch` (the part removed), `no_space`,
    `download` (final for a 4xx, else after `policy.attempts`), `operator` (`cancel` set: the
    part is kept for the next try). A `dest` already there with the right digest is kept.
    """
    if size > policy.max_bytes:
        raise Refused(TOO_LARGE, f"{dest.name} is {size} bytes, more than the {policy.max_bytes} allowed")
    if _already_there(dest, size, sha256):
        _Progress(progress, size).update(size)
        return
    part = Part(dest, url, size, sha256)
    try:
        _check_space(part, policy)
        reporter = _Progress(progress, size)
        _with_retries(url, policy, cancel, lambda: _attempt(url, part, policy, reporter, cancel))
        part.commit(dest, sha256)
    except Refused as refusal:
        # What the server sent is not the release's file: nothing of it is worth resuming.
        if refusal.code in (SIZE_MISMATCH, TOO_LARGE):
            part.discard()
        raise
    finally:
        part.close()


def _already_there(dest: Path, size: int, sha256: str) -> bool:
    """A restart after the rename but before the whole release was admitted: `dest` is done."""
    try:
        if dest.stat().st_size != size:
            return False
    except FileNotFoundError:
        return False
    return hash_file(dest).hexdigest() == sha256.lower()


def _check_space(part: Part, policy: FetchPolicy) -> None:
    directory = part.path.parent
    free = shutil.disk_usage(directory).free
    needed = part.size - part.done
    if free < needed + policy.min_free_bytes:
        raise Refused(NO_SPACE, f"{needed} more bytes of {part.path.name[:-len(PART_SUFFIX)]} would leave less than "
                      f"{policy.min_free_bytes} bytes free in {directory} ({free} free)", final=False)


def _with_retries(url: str, policy: FetchPolicy, cancel: Optional[threading.Event], attempt: Callable[[], T]) -> T:
    """`attempt()` until it returns, a Refused, or `policy.attempts` transient failures."""
    last = "no attempt"
    for number in range(1, policy.attempts + 1):
        _check_cancel(url, cancel)
        try:
            return attempt()
        except ssl.SSLCertVerificationError as exc:
            # The server is not who the CA says: no later attempt changes that.
            raise Refused(DOWNLOAD, f"{url}: {exc.verify_message or exc}") from exc
        except (_Transient, OSError, http.client.HTTPException) as exc:
            last = _describe(exc, policy)
            logger.warning("fleet: fetching %s: attempt %d of %d failed: %s", url, number, policy.attempts, last)
        if number < policy.attempts:
            (cancel or threading.Event()).wait(_backoff(policy, number))
    raise Refused(DOWNLOAD, f"{url}: {last} (after {policy.attempts} attempts)", final=False)


def _describe(exc: BaseException, policy: FetchPolicy) -> str:
    if isinstance(exc, TimeoutError):
        return f"timed out (connect and headers within {policy.timeout_s:g} s, then a byte within {policy.stall_s:g} s)"
    return str(exc) or type(exc).__name__


def _backoff(policy: FetchPolicy, number: int) -> float:
    """Full jitter (uniform up to the exponential step): fifty gateways cut off by one outage
    do not come back in step."""
    return random.uniform(0, min(policy.max_backoff_s, policy.backoff_s * 2 ** (number - 1)))


def _check_cancel(url: str, cancel: Optional[threading.Event], done: Optional[int] = None) -> None:
    if cancel is not None and cancel.is_set():
        where = "" if done is None else f" at byte {done}"
        raise Refused(OPERATOR, f"the download of {url} was cancelled{where} (the partial file is kept)")


def _open(url: str, policy: FetchPolicy, headers: Mapping[str, str]):
    """(connection, response) of a GET of `url`, redirects followed; the body then reads with
    `stall_s` as the socket's timeout."""
    origin = urlsplit(url).netloc
    for _ in range(MAX_REDIRECTS + 1):
        conn = _connection(url, policy)
        try:
            conn.connect()
            # getresponse() drops conn.sock on a `Connection: close` answer; the response reads on.
            sock = conn.sock
            split = urlsplit(url)
            # The policy's headers (a bearer token) go to the configured server only, not to
            # wherever it redirects.
            extra = policy.headers if split.netloc == origin else {}
            conn.request("GET", (split.path or "/") + (f"?{split.query}" if split.query else ""),
                         headers={**extra, **headers})
            resp = conn.getresponse()
        except BaseException:
            conn.close()
            raise
        location = resp.getheader("Location")
        if resp.status not in REDIRECTS or not location:
            sock.settimeout(policy.stall_s)
            return conn, resp
        resp.close()
        conn.close()
        url = urljoin(url, location)
    raise Refused(DOWNLOAD, f"{url}: more than {MAX_REDIRECTS} redirects")


def _connection(url: str, policy: FetchPolicy) -> http.client.HTTPConnection:
    split = urlsplit(url)
    if split.scheme not in _PORTS or not split.hostname:
        raise Refused(DOWNLOAD, f"{url}: not an http:// or https:// URL")
    port = split.port or _PORTS[split.scheme]
    if split.scheme == "http":
        return http.client.HTTPConnection(split.hostname, port, timeout=policy.timeout_s)
    context = ssl.create_default_context(cafile=None if policy.ca_file is None else str(policy.ca_file))
    return http.client.HTTPSConnection(split.hostname, port, timeout=policy.timeout_s, context=context)


def _check_status(url: str, resp: http.client.HTTPResponse) -> None:
    status = resp.status
    if status in (200, 206):
        return
    if status >= 500 or status in RETRIED_4XX:
        raise _Transient(f"HTTP {status} {resp.reason}")
    raise Refused(DOWNLOAD, f"{url}: HTTP {status} {resp.reason}")


def _content_length(resp: http.client.HTTPResponse) -> Optional[int]:
    value = resp.getheader("Content-Length")
    return int(value) if value is not None and value.strip().isdigit() else None


def _attempt(url: str, part: Part, policy: FetchPolicy, reporter: "_Progress",
             cancel: Optional[threading.Event]) -> None:
    """One request for what the part lacks, streamed into it."""
    if part.done == part.size:
        return  # every byte is there already (a restart after the last write)
    conn, resp = _open(url, policy, part.range_headers())
    try:
        if resp.status == RANGE_NOT_SATISFIABLE and part.done:
            # The file shrank under an unchanged validator (Last-Modified is to the second).
            have = part.done
            part.discard()
            raise _Transient(f"HTTP {resp.status} for bytes={have}-: starting again from zero")
        expected = _start_body(url, part, resp, policy)
        _stream(url, part, resp, expected, reporter, cancel)
    finally:
        resp.close()
        conn.close()
        part.flush()


def _start_body(url: str, part: Part, resp: http.client.HTTPResponse, policy: FetchPolicy) -> Optional[int]:
    """Check the answer's status and sizes; a 200 restarts the part. Returns the body's length."""
    _check_status(url, resp)
    length, validator = _content_length(resp), _validator(resp)
    start, total = _content_range(resp.getheader("Content-Range", "")) if resp.status == 206 else (0, length)
    if total is not None:
        _check_total(url, total, part.size, policy)
    if resp.status == 200 or start == 0:
        part.restart(validator)  # the file from its first byte, whatever the part held
    elif start != part.done or (validator is not None and validator != part.validator):
        part.restart(validator)
        raise _Transient(f"the server answered the range from byte {start} of {validator}, not byte "
                         f"{part.done} of {part.validator}: starting again from zero")
    return length


def _content_range(value: str) -> tuple[Optional[int], Optional[int]]:
    """(first byte, total) of `bytes first-last/total`; None where absent or `*`."""
    unit, _, spec = value.strip().partition(" ")
    span, _, total = spec.partition("/")
    first = span.partition("-")[0]
    if unit != "bytes" or not first.isdigit():
        return None, None
    return int(first), int(total) if total.isdigit() else None


def _check_total(url: str, total: int, size: int, policy: FetchPolicy) -> None:
    if total > policy.max_bytes:
        raise Refused(TOO_LARGE, f"{url} is {total} bytes, more than the {policy.max_bytes} allowed")
    if total != size:
        raise Refused(SIZE_MISMATCH, f"{url} is {total} bytes on the server; the manifest says {size}")


def _stream(url: str, part: Part, resp: http.client.HTTPResponse, expected: Optional[int],
            reporter: "_Progress", cancel: Optional[threading.Event]) -> None:
    received = 0
    while True:
        _check_cancel(url, cancel, part.done)
        chunk = resp.read1(CHUNK_BYTES)
        if not chunk:
            break
        if part.done + len(chunk) > part.size:
            raise Refused(SIZE_MISMATCH, f"{url} sent more than the {part.size} bytes the manifest says")
        part.write(chunk)
        received += len(chunk)
        reporter.update(part.done)
    if expected is not None and received < expected:
        raise _Transient(f"the connection closed after {received} of {expected} bytes")
    if part.done < part.size:
        raise Refused(SIZE_MISMATCH, f"{url} ended at {part.done} bytes; the manifest says {part.size} "
                      "(a truncated release)")


def _validator(resp: http.client.HTTPResponse) -> Optional[str]:
    """What If-Range may carry: a strong ETag, else Last-Modified (RFC 9110 13.1.5: a weak ETag
    may not be used in If-Range)."""
    etag = resp.getheader("ETag")
    if etag and not etag.startswith("W/"):
        return etag
    return resp.getheader("Last-Modified")


class _Progress:
    """Calls `callback(done, total)` each PROGRESS_BYTES and at the end, not per read."""

    def __init__(self, callback: Optional[Callable[[int, int], None]], total: int):
        self._callback, self._total, self._last = callback, total, None

    def update(self, done: int) -> None:
        if self._callback is None:
            return
        if self._last is None or done - self._last >= PROGRESS_BYTES or done == self._total or done < self._last:
            self._last = done
            self._callback(done, self._total)
