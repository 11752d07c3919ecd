"""A download in progress on disk: `<dest>.part` and, beside it, `<dest>.part.meta` (JSON: the
server's validator, the size and sha256 the part is of, and the URL it came from), so that a daemon restart
resumes it (daemon/fleet/node/fetch.py asks the server for the rest with Range and If-Range).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Callable, Optional, TypeVar

from daemon.fleet.node.durable import fsync_path, write_json
from daemon.fleet.release.refusal import DOWNLOAD, NO_SPACE, SHA256_MISMATCH, Refused

logger = logging.getLogger(__name__)

T = TypeVar("T")
CHUNK_BYTES = 64 << 10
PART_SUFFIX = ".part"
META_SUFFIX = ".part.meta"
DIGEST_SHOWN = 12  # hex digits of a digest in a message: enough to tell two apart
_PART_MODE = 0o600


def hash_file(path: Path) -> "hashlib._Hash":
    hasher = hashlib.sha256()
    with open(path, "rb") as data:
        for chunk in iter(lambda: data.read(CHUNK_BYTES), b""):
            hasher.update(chunk)
    return hasher


class Part:
    """`<dest>.part`, the bytes so far and their running sha256, and `<dest>.part.meta` (JSON:
    the validator, the size and digest it is a part of, the URL). Files are created only once
    a server answers, so a refusal before that leaves nothing behind."""

    def __init__(self, dest: Path, url: str, size: int, sha256: str):
        self.path = dest.with_name(dest.name + PART_SUFFIX)
        self.meta_path = dest.with_name(dest.name + META_SUFFIX)
        self.size = size
        # A part is of a file by its size and digest, not its URL: another mirror may resume it,
        # since If-Range makes a server whose validator differs send the whole file instead.
        self._of = {"size": size, "sha256": sha256.lower()}
        self._url = url
        self.validator: Optional[str] = None
        self.done = 0
        self._hasher = hashlib.sha256()
        self._file = None
        self._resume()

    def _resume(self) -> None:
        """Take up a part left on disk, if its meta says it is of this very file."""
        try:
            meta = json.loads(self.meta_path.read_text(encoding="utf-8"))
            length = self.path.stat().st_size
        except (OSError, ValueError):
            self._unlink()
            return
        if not isinstance(meta, dict) or meta.get("of") != self._of or not meta.get("validator") \
                or not 0 < length <= self.size:
            self._unlink()
            return
        self._hasher = hash_file(self.path)
        self.done, self.validator = length, meta["validator"]
        logger.info("fleet: resuming %s at byte %d of %d", self.path.name, length, self.size)

    def range_headers(self) -> dict[str, str]:
        if self.done == 0 or self.validator is None:
            return {}
        return {"Range": f"bytes={self.done}-", "If-Range": self.validator}

    def restart(self, validator: Optional[str]) -> None:
        """Empty the part: what comes next is the file from its first byte."""
        self.close()
        self.done, self.validator, self._hasher = 0, validator, hashlib.sha256()
        # In this order a kill at any point leaves no meta, or a meta beside an empty part: never
        # the new validator beside the old bytes (their resume would append the new file to them).
        self._guard(lambda: self.meta_path.unlink(missing_ok=True))
        fd = self._guard(lambda: os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, _PART_MODE))
        self._file = os.fdopen(fd, "wb")
        self._guard(lambda: os.fsync(fd))  # the emptying is on disk before a meta names the part
        if validator is not None:  # else nothing to resume against: a restart starts over
            self._guard(lambda: write_json(self.meta_path, {"of": self._of, "validator": validator, "url": self._url}))

    def write(self, chunk: bytes) -> None:
        if self._file is None:
            self._file = self._guard(lambda: open(self.path, "ab"))
        self._guard(lambda: self._file.write(chunk))
        self._hasher.update(chunk)
        self.done += len(chunk)

    def _guard(self, step: Callable[[], T]) -> T:
        """Run a disk step; a full disk is `no_space` with the part removed (a part that cannot
        grow is of no use, and it holds the space the rest of the store needs)."""
        try:
            return step()
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                self.discard()
                raise Refused(NO_SPACE, f"the disk filled up writing {self.path}", final=False) from exc
            raise Refused(DOWNLOAD, f"writing {self.path}: {exc}", final=False) from exc

    def flush(self) -> None:
        """Flush and fsync what arrived, so a restart resumes from bytes that are really there."""
        if self._file is not None:
            self._guard(self._file.flush)
            self._guard(lambda: os.fsync(self._file.fileno()))

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._drop_file()

    def _drop_file(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            try:
                file.close()
            except OSError:
                pass  # a flush has already said what went wrong (or, on ENOSPC, the file goes anyway)

    def commit(self, dest: Path, sha256: str) -> None:
        """Verified and complete: fsynced, renamed to `dest`, the directory fsynced."""
        self.close()
        digest = self._hasher.hexdigest()
        if digest != sha256.lower():
            self.discard()
            raise Refused(SHA256_MISMATCH, f"{dest.name}: sha256 {digest[:DIGEST_SHOWN]}… but the manifest says "
                          f"{sha256.lower()[:DIGEST_SHOWN]}…")
        os.replace(self.path, dest)
        self.meta_path.unlink(missing_ok=True)
        fsync_path(dest.parent)

    def discard(self) -> None:
        self._drop_file()
        self._unlink()
        self.done, self.validator, self._hasher = 0, None, hashlib.sha256()

    def _unlink(self) -> None:
        self.path.unlink(missing_ok=True)
        self.meta_path.unlink(missing_ok=True)
