"""The on-disk store of one model's releases on a node, and the journaled swap between them.

Layout under the store root (a directory the daemon owns; under systemd, its StateDirectory):

    <root>/<model>/incoming/<serial>/   a release being downloaded (kept across restarts: it resumes)
    <root>/<model>/releases/<serial>/   whole releases only: manifest.json, manifest.json.minisig, the files
    <root>/<model>/current  -> releases/<serial>   relative symlink: what the daemon loads
    <root>/<model>/previous -> releases/<serial>   relative symlink: where a rollback goes, may be absent
    <root>/<model>/journal.json         a swap's intent, present only while one is under way
    <root>/<model>/state.json           the node agent's record for this model (opaque to the store)

Why it survives a kill at any instant: a release reaches releases/ by one rename of a
directory whose files were fsynced first, so releases/ never holds half a release; a link
is moved by symlinking a temporary name and renaming it over the old one, so `current`
always names some release; and a swap (two links) writes its whole intent to journal.json
before touching either link, so `recover()` at start-up finishes it from the journal alone
(roll forward: its target is in releases/, hence whole). A release is removed by renaming
it out of releases/ first, then deleting it. Everything that needs it is fsynced, so a
power cut keeps the same promises as far as the file system keeps its own.

One process (the node agent) changes a store at a time; others only read `current`.

Test hook: EDGE_INFERD_FLEET_KILL_AT=<step> makes the process SIGKILL itself at that step
(KILL_STEPS), so tests/fleet/node/test_store.py can kill a real process between two writes. The
swap's steps are the same in `recover()`'s roll-forward, so a recovery can be killed too.
"""

from __future__ import annotations

import filecmp
import json
import logging
import os
import shutil
import signal
import stat
from pathlib import Path
from typing import Collection, Optional

from daemon.config.fleet import CURRENT_LINK
from daemon.fleet.node.durable import TMP_PREFIX, fsync_path, read_json_object, remove, replace_link, write_json
from daemon.fleet.release.refusal import DOWNLOAD, OPERATOR, SERIAL_MISMATCH, UNSAFE_NAME, Refused

logger = logging.getLogger(__name__)

KILL_ENV = "EDGE_INFERD_FLEET_KILL_AT"
MID_ADMIT, AFTER_JOURNAL, AFTER_PREVIOUS, AFTER_CURRENT, AFTER_UNJOURNAL = (
    "mid_admit", "after_journal", "after_previous", "after_current", "after_unjournal")
KILL_STEPS = (MID_ADMIT, AFTER_JOURNAL, AFTER_PREVIOUS, AFTER_CURRENT, AFTER_UNJOURNAL)

ACTIVATE, REVERT = "activate", "revert"
PART_SUFFIX = ".part"  # the fetcher's partial files: never admitted
CORRUPT_SUFFIX = ".corrupt"
_DIR_MODE = 0o700
_GROUP_OTHER_BITS = 0o077
_MAX_NAME_BYTES = 255  # one path component on every Linux file system (docs/fleet.md, unsafe_name)
_PREVIOUS, _JOURNAL, _STATE = "previous", "journal.json", "state.json"
_CURRENT = CURRENT_LINK  # where the config reads a managed model's files (daemon/config/fleet.py)
_INCOMING, _RELEASES = "incoming", "releases"


def kill_point(step: str) -> None:
    """Test hook: SIGKILL this process here when EDGE_INFERD_FLEET_KILL_AT names `step`.
    SIGKILL, not an exception: nothing after it runs, no `finally`, no buffered write."""
    if os.environ.get(KILL_ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)


class ModelStore:
    """The releases of one model under `root`: admit, activate, revert, recover, prune, state."""

    def __init__(self, root: Path, model: str):
        _check_model_name(model)
        self.model = model
        self.root = Path(root)
        self.dir = self.root / model
        self.root.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
        for path in (self.dir, self.dir / _INCOMING, self.dir / _RELEASES):
            path.mkdir(mode=_DIR_MODE, exist_ok=True)
        for path in (self.root, self.dir):
            _keep_private(path)

    # --- downloads and releases -------------------------------------------------------------

    def incoming(self, serial: int) -> Path:
        """The directory the fetcher writes `serial` into; created if missing, kept if there."""
        path = self.dir / _INCOMING / _serial_name(serial)
        path.mkdir(mode=_DIR_MODE, exist_ok=True)
        return path

    def discard_incoming(self, serial: int) -> None:
        shutil.rmtree(self.dir / _INCOMING / _serial_name(serial), ignore_errors=True)

    def admit(self, serial: int) -> Path:
        """Move the whole (verified by the caller) incoming/<serial> into releases/; returns its dir.

        Idempotent: a release already in releases/ is returned as is, after discarding an
        incoming copy with the same files (different files under one serial are refused)."""
        source = self.dir / _INCOMING / _serial_name(serial)
        target = self.dir / _RELEASES / _serial_name(serial)
        if target.is_dir():
            return self._admitted_again(serial, source, target)
        if not source.is_dir():
            raise FileNotFoundError(f"{source}: no download of {self.model} serial {serial} to admit")
        for entry in _release_files(source):
            fsync_path(entry)
        fsync_path(source)
        kill_point(MID_ADMIT)
        os.rename(source, target)  # one step: releases/ never holds part of a release
        fsync_path(target.parent)
        fsync_path(source.parent)
        logger.info("%s: release %s admitted", self.model, serial)
        return target

    def _admitted_again(self, serial: int, source: Path, target: Path) -> Path:
        if source.is_dir():
            if not _same_files(source, target):
                raise Refused(SERIAL_MISMATCH, f"{self.model} serial {serial} is already kept in {target} with "
                                               f"other files than {source}: a serial names one release")
            self.discard_incoming(serial)
        return target

    def kept(self) -> list[int]:
        """Serials in releases/, ascending."""
        found = [_parse_serial(p.name) for p in (self.dir / _RELEASES).iterdir() if p.is_dir()]
        return sorted(s for s in found if s is not None)

    def release_dir(self, serial: int) -> Optional[Path]:
        path = self.dir / _RELEASES / _serial_name(serial)
        return path if path.is_dir() else None

    def current(self) -> Optional[int]:
        """The serial `current` points to; None when absent or not pointing to a kept release."""
        return self._link_serial(_CURRENT)

    def previous(self) -> Optional[int]:
        return self._link_serial(_PREVIOUS)

    def _link_serial(self, name: str) -> Optional[int]:
        try:
            target = os.readlink(self.dir / name)
        except OSError:  # absent, or not a link
            return None
        head, _, tail = target.partition("/")
        serial = _parse_serial(tail) if head == _RELEASES else None
        return serial if serial is not None and self.release_dir(serial) else None

    # --- the swap ---------------------------------------------------------------------------

    def activate(self, serial: int, refused: Collection[int] = ()) -> None:
        """Make `serial` (a kept release) current; previous becomes `below(serial, refused)`, where
        a rollback from it goes, whatever ran before it."""
        if self.release_dir(serial) is None:
            raise FileNotFoundError(f"{self.model} serial {serial} is not a kept release (kept: {self.kept()})")
        if self.current() != serial:
            self._swap(ACTIVATE, serial, self.below(serial, refused))

    def below(self, serial: int, refused: Collection[int] = ()) -> Optional[int]:
        """The newest kept release below `serial` that the node has not `refused`. By serial, not by
        time: a node sent down from 5 to a kept 1 (an abort's restored entry) that rolls back from 1
        must not go "back" up to 5."""
        older = [s for s in self.kept() if s < serial and s not in refused]
        return older[-1] if older else None

    def revert(self, refused: Collection[int] = ()) -> int:
        """Point `current` back to `below(current)`, never forward; previous becomes the release below
        that one, or goes. Returns the serial now current."""
        before = self.current()
        back_to = None if before is None else self.below(before, refused)
        if back_to is None:
            raise Refused(OPERATOR, f"{self.model} has no previous release to go back to (current serial "
                                    f"{before}, kept {self.kept()}, refused {sorted(refused)})")
        self._swap(REVERT, back_to, self.below(back_to, refused))
        return back_to

    def deactivate(self) -> None:
        """No release current: the config's own model files serve again (a first release sent back,
        with no earlier release kept). One unlink: no journal needed."""
        self._set_link(_CURRENT, None)
        fsync_path(self.dir)
        logger.info("%s: no release current; the configured files serve", self.model)

    def back(self, refused: Collection[int] = ()) -> Optional[int]:
        """`revert`, or `deactivate` when nothing is kept below the current release: the serial now
        current (None: the configured files)."""
        current = self.current()
        if current is not None and self.below(current, refused) is None:
            self.deactivate()
            return None
        return self.revert(refused)

    def _swap(self, op: str, to: int, prev_after: Optional[int]) -> None:
        journal = {"op": op, "to": to, "from": self.current(), "prev_before": self.previous(),
                   "prev_after": prev_after}
        write_json(self.dir / _JOURNAL, journal)
        kill_point(AFTER_JOURNAL)
        self._apply(to, prev_after)
        logger.info("%s: %s to serial %s (was %s; previous now %s)", self.model, op, to, journal["from"], prev_after)

    def _apply(self, to: int, prev_after: Optional[int]) -> None:
        """Set previous, then current, then drop the journal: each step safe to repeat."""
        self._set_link(_PREVIOUS, prev_after)
        kill_point(AFTER_PREVIOUS)
        self._set_link(_CURRENT, to)
        kill_point(AFTER_CURRENT)
        fsync_path(self.dir)
        remove(self.dir / _JOURNAL)
        kill_point(AFTER_UNJOURNAL)

    def _set_link(self, name: str, serial: Optional[int]) -> None:
        link = self.dir / name
        if serial is None:
            remove(link)
            return
        replace_link(link, f"{_RELEASES}/{_serial_name(serial)}")

    # --- start-up ---------------------------------------------------------------------------

    def recover(self) -> Optional[str]:
        """Finish what a killed process left: a swap under way, a `current` that names no kept
        release, temporary names. Returns what it did, in words, or None when nothing was left.
        After it, `current` is absent (nothing committed yet) or names one whole release, and
        `previous` is absent or names another."""
        done = [f"removed {name}" for name in self._remove_temporaries()]
        journal = self._read_journal()
        if journal is not None:
            done.append(self._finish(journal))
        done += self._repair_links()
        if not done:
            return None
        message = "; ".join(done)
        logger.warning("%s: recovered the store: %s", self.model, message)
        return message

    def _remove_temporaries(self) -> list[str]:
        removed = []
        for entry in sorted(self.dir.iterdir()):
            if entry.name.startswith(TMP_PREFIX):
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
                removed.append(entry.name)
        return removed

    def _read_journal(self) -> Optional[dict]:
        path = self.dir / _JOURNAL
        if not path.exists():
            return None
        try:
            journal = json.loads(path.read_text())
            _check_journal(journal)
            return journal
        except (OSError, ValueError, TypeError, KeyError) as exc:
            logger.warning("%s: %s cannot be read (%s); moved aside to %s%s", self.model, path, exc,
                           path.name, CORRUPT_SUFFIX)
            os.replace(path, path.with_name(path.name + CORRUPT_SUFFIX))
            fsync_path(self.dir)
            return None

    def _finish(self, journal: dict) -> str:
        to, prev_after = journal["to"], journal["prev_after"]
        if self.release_dir(to) is not None:
            self._apply(to, prev_after if prev_after is None or self.release_dir(prev_after) else None)
            return f"finished {journal['op']} to serial {to}"
        # Its target left releases/ (by hand: the store never removes a release a journal names):
        # the swap cannot finish, so the links go back to where they were.
        back, prev_back = journal["from"], journal["prev_before"]
        self._set_link(_PREVIOUS, prev_back if prev_back is not None and self.release_dir(prev_back) else None)
        self._set_link(_CURRENT, back if back is not None and self.release_dir(back) else None)
        fsync_path(self.dir)
        remove(self.dir / _JOURNAL)
        return f"undid {journal['op']} to serial {to} (release gone), back to serial {back}"

    def _repair_links(self) -> list[str]:
        done = []
        for name in (_CURRENT, _PREVIOUS):
            link = self.dir / name
            if link.exists() and not link.is_symlink():
                os.replace(link, link.with_name(name + CORRUPT_SUFFIX))  # not ours to delete
                done.append(f"moved a {name} that was not a link aside")
        kept = self.kept()
        if self.current() is None and (self.dir / _CURRENT).is_symlink():
            self._set_link(_CURRENT, kept[-1] if kept else None)
            done.append(f"current named no kept release; now {kept[-1] if kept else 'absent'}")
        current, previous = self.current(), self.previous()
        if (self.dir / _PREVIOUS).is_symlink() and (previous is None or previous == current):
            self._set_link(_PREVIOUS, None)
            done.append("previous named no other kept release; removed")
        if done:
            fsync_path(self.dir)
        return done

    # --- housekeeping -----------------------------------------------------------------------

    def prune(self, keep: int) -> list[int]:
        """Remove the oldest releases until `keep` are left, never current or previous; and the
        incoming dirs of serials up to current (stale downloads). Returns the serials removed."""
        if keep < 0:
            raise ValueError(f"keep must be >= 0, not {keep}")
        current = self.current()
        protected = {current, self.previous()}
        kept = self.kept()
        removed = []
        for serial in kept:
            if len(kept) - len(removed) <= keep:
                break
            if serial not in protected:
                self._remove_release(serial)
                removed.append(serial)
        for path in (self.dir / _INCOMING).iterdir():
            serial = _parse_serial(path.name)
            if current is not None and serial is not None and serial <= current:
                shutil.rmtree(path, ignore_errors=True)
        return removed

    def _remove_release(self, serial: int) -> None:
        # Out of releases/ in one rename first, so a kill mid-delete leaves no partial release there.
        trash = self.dir / f"{TMP_PREFIX}removed.{_serial_name(serial)}"
        shutil.rmtree(trash, ignore_errors=True)  # left by a prune killed before a recover()
        os.rename(self.dir / _RELEASES / _serial_name(serial), trash)
        fsync_path(self.dir / _RELEASES)
        shutil.rmtree(trash)
        logger.info("%s: release %s pruned", self.model, serial)

    def read_state(self) -> dict:
        """The agent's record; {} when missing, or when corrupt (then moved aside, with a warning)."""
        return read_json_object(self.dir / _STATE, CORRUPT_SUFFIX, self.model)

    def write_state(self, state: dict) -> None:
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict, not {type(state).__name__}")
        write_json(self.dir / _STATE, state)

    def free_bytes(self) -> int:
        """Bytes an unprivileged writer may still use on the store's file system."""
        stats = os.statvfs(self.dir)
        return stats.f_bavail * stats.f_frsize


def _keep_private(directory: Path) -> None:
    """0700 for a directory we own (mkdir's mode obeys the umask, systemd's StateDirectory is 0755
    unless told otherwise); never chmod someone else's, as daemon/cache/disk_tier.py does."""
    info = directory.stat()
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid == os.geteuid():
        if mode != _DIR_MODE:
            os.chmod(directory, _DIR_MODE)
    elif mode & _GROUP_OTHER_BITS:
        logger.warning("fleet store %s belongs to uid %d with mode %o: left as it is, so others may read the "
                       "node's records; make it the service user's, mode 0700", directory, info.st_uid, mode)


# --- names ------------------------------------------------------------------------------------

def _check_model_name(model: str) -> None:
    """The model name becomes a directory: one plain path component (docs/fleet.md's file name rule)."""
    if not isinstance(model, str) or model in ("", ".", "..") or any(c in model for c in "/\\\0") \
            or len(model.encode("utf-8", "surrogateescape")) > _MAX_NAME_BYTES:
        raise Refused(UNSAFE_NAME, f"model name {model!r} is not one plain path component "
                                   f"(no '/', '\\' or NUL, not '.' or '..', 1 to {_MAX_NAME_BYTES} bytes)")


def _serial_name(serial: int) -> str:
    if type(serial) is not int or serial < 0:
        raise ValueError(f"a serial is an integer >= 0, not {serial!r}")
    return str(serial)


def _parse_serial(name: str) -> Optional[int]:
    """The serial a directory name spells canonically ("4", not "04" or "+4"), else None."""
    return int(name) if name.isdigit() and name.isascii() and str(int(name)) == name else None


def _check_journal(journal: object) -> None:
    if not isinstance(journal, dict) or journal["op"] not in (ACTIVATE, REVERT):
        raise ValueError("not a journal of this store")
    for key in ("from", "prev_before", "prev_after"):
        if journal[key] is not None:
            _serial_name(journal[key])
    _serial_name(journal["to"])


# --- admitting --------------------------------------------------------------------------------

def _release_files(directory: Path) -> list[Path]:
    """The files of a whole release: plain files only (a link could point anywhere), none partial."""
    entries = sorted(directory.iterdir())
    for entry in entries:
        if entry.is_symlink() or not entry.is_file():
            raise Refused(UNSAFE_NAME, f"{entry}: a release holds plain files only")
        if entry.name.endswith(PART_SUFFIX):
            raise Refused(DOWNLOAD, f"{entry}: still being downloaded", final=False)
    return entries


def _same_files(one: Path, other: Path) -> bool:
    names = sorted(p.name for p in one.iterdir())
    if names != sorted(p.name for p in other.iterdir()):
        return False
    return all(filecmp.cmp(one / name, other / name, shallow=False) for name in names)
