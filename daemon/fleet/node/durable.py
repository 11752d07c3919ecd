"""Writes that survive a kill at any instant: each replaces a name in one rename, and is fsynced
so that a power cut keeps it too (as far as the file system keeps its own promises).

Temporary names start with TMP_PREFIX and end with the writer's pid, next to the name they
replace, so the rename stays within one directory (one file system) and whoever owns that
directory can remove what a killed writer left (daemon/fleet/node/store.py: `recover`).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

TMP_PREFIX = ".tmp."
FILE_MODE = 0o600  # the store's records are the daemon's own


def temporary(path: Path) -> Path:
    """The temporary name this process writes `path` under before renaming it into place."""
    return path.with_name(f"{TMP_PREFIX}{path.name}.{os.getpid()}")


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (a directory's fsync makes the renames and unlinks in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: Path, document: dict) -> None:
    """Replace `path` with `document` in one step: a temporary file, fsynced, renamed over it."""
    staged = temporary(path)
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    with os.fdopen(fd, "w") as out:
        json.dump(document, out, sort_keys=True)
        out.flush()
        os.fsync(out.fileno())
    os.replace(staged, path)
    fsync_path(path.parent)


def replace_link(link: Path, target: str) -> None:
    """Point the symlink `link` at `target` in one step: a reader sees the old link or the new one,
    never none (unlink-then-symlink would leave a moment with none). Not fsynced: the caller
    fsyncs the directory once after its last link."""
    staged = temporary(link)
    remove(staged)
    os.symlink(target, staged)
    os.replace(staged, link)


def remove(path: Path) -> None:
    """Unlink `path` if there, and make the removal durable."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    fsync_path(path.parent)


def read_json_object(path: Path, aside_suffix: str, owner: str) -> dict:
    """The JSON object in `path`; {} when missing, or when it cannot be read as one: then it is moved
    aside to `<path><aside_suffix>` (for a person to look at), with a warning naming `owner`."""
    try:
        document = json.loads(path.read_text())
        if isinstance(document, dict):
            return document
        problem = f"a JSON {type(document).__name__}, not an object"
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        problem = str(exc)
    aside = path.with_name(path.name + aside_suffix)
    logger.warning("%s: %s cannot be read (%s); moved aside to %s, starting from {}", owner, path, problem, aside)
    os.replace(path, aside)
    return {}
