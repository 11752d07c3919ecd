"""daemon/fleet/node/store.py on real files; the swap's kill points with a real child process that
SIGKILLs itself at each step (EDGE_INFERD_FLEET_KILL_AT), then recover() in this process."""

from __future__ import annotations

import json
import logging
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from daemon.fleet.release.refusal import DOWNLOAD, OPERATOR, SERIAL_MISMATCH, UNSAFE_NAME, Refused
from daemon.fleet.node.durable import TMP_PREFIX
from daemon.fleet.node.store import (AFTER_CURRENT, AFTER_JOURNAL, AFTER_PREVIOUS, AFTER_UNJOURNAL, KILL_ENV, KILL_STEPS,
                                MID_ADMIT, ModelStore)

REPO = Path(__file__).resolve().parents[3]
MODEL = "activity"
CHILD_TIMEOUT_S = 60  # a child that neither dies nor exits is a failure, not a hang

# The child: admit and activate release 3 (op "activate"), revert (op "revert") or recover.
CHILD = """
import sys
from pathlib import Path
from daemon.fleet.node.store import ModelStore
root, op = Path(sys.argv[1]), sys.argv[2]
store = ModelStore(root, "activity")
if op == "activate":
    incoming = store.incoming(3)
    for name, data in {"manifest.json": b"manifest 3", "manifest.json.minisig": b"sig 3",
                       "model.tflite": b"model 3"}.items():
        (incoming / name).write_bytes(data)
    store.admit(3)
    store.activate(3)
elif op == "revert":
    store.revert()
else:
    store.recover()
"""


def _files(serial: int) -> dict[str, bytes]:
    return {"manifest.json": f"manifest {serial}".encode(), "manifest.json.minisig": f"sig {serial}".encode(),
            "model.tflite": f"model {serial}".encode()}


def _download(store: ModelStore, serial: int, files: dict[str, bytes] | None = None) -> Path:
    incoming = store.incoming(serial)
    for name, data in (files or _files(serial)).items():
        (incoming / name).write_bytes(data)
    return incoming


def _store_with(root: Path, *serials: int) -> ModelStore:
    """A store that admitted and activated `serials` in order."""
    store = ModelStore(root, MODEL)
    for serial in serials:
        _download(store, serial)
        store.admit(serial)
        store.activate(serial)
    return store


def _assert_whole(store: ModelStore, current: int, previous: int | None) -> None:
    """`current` resolves to the whole release `current`, `previous` as given, no swap left over."""
    assert store.current() == current and store.previous() == previous
    link = store.dir / "current"
    assert os.readlink(link) == f"releases/{current}"
    assert link.resolve() == store.release_dir(current).resolve()
    assert {p.name: p.read_bytes() for p in link.resolve().iterdir()} == _files(current)
    assert (link / "model.tflite").resolve().read_bytes() == _files(current)["model.tflite"]
    assert not (store.dir / "journal.json").exists()
    assert [p.name for p in store.dir.iterdir() if p.name.startswith(TMP_PREFIX)] == []


def _run_child(root: Path, op: str, kill_at: str) -> int:
    env = {**os.environ, "PYTHONPATH": str(REPO), KILL_ENV: kill_at}
    return subprocess.run([sys.executable, "-c", CHILD, str(root), op], env=env, timeout=CHILD_TIMEOUT_S).returncode


# --- the happy paths ----------------------------------------------------------------------------

def test_a_new_store_has_private_dirs_and_nothing_committed(tmp_path):
    store = ModelStore(tmp_path / "fleet", MODEL)
    for path in (store.dir, store.dir / "incoming", store.dir / "releases"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert (store.kept(), store.current(), store.previous(), store.recover()) == ([], None, None, None)
    assert store.free_bytes() > 0


def test_a_root_made_wider_than_private_is_made_private(tmp_path):
    root = tmp_path / "fleet"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)  # as systemd makes a StateDirectory
    ModelStore(root, MODEL)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700


def test_admit_moves_the_download_into_releases_and_activate_swaps_the_links(tmp_path):
    store = ModelStore(tmp_path, MODEL)
    _download(store, 1)
    released = store.admit(1)
    assert released == store.release_dir(1) == store.dir / "releases" / "1"
    assert not (store.dir / "incoming" / "1").exists()
    assert store.current() is None  # admitted is not active
    store.activate(1)
    _assert_whole(store, 1, None)
    _download(store, 2)
    store.admit(2)
    store.activate(2)
    _assert_whole(store, 2, 1)
    assert store.kept() == [1, 2]


def test_the_model_file_resolves_through_current_to_its_release_and_stays_there(tmp_path):
    """The daemon loads <root>/<model>/current/<model_file> resolved to its real path: that path is
    a plain file in a plain directory, and a later swap does not move it from under a loaded model."""
    store = _store_with(tmp_path, 1)
    loaded = (store.dir / "current" / "model.tflite").resolve()
    assert loaded == (store.dir / "releases" / "1" / "model.tflite").resolve()
    assert not loaded.is_symlink() and not loaded.parent.is_symlink()
    _download(store, 2)
    store.admit(2)
    store.activate(2)
    assert loaded.read_bytes() == _files(1)["model.tflite"]
    now = (store.dir / "current" / "model.tflite").resolve()
    assert now == (store.dir / "releases" / "2" / "model.tflite").resolve()


def test_activating_the_current_release_again_changes_nothing(tmp_path):
    store = _store_with(tmp_path, 1, 2)
    store.activate(2)
    _assert_whole(store, 2, 1)


def test_activating_a_release_not_kept_is_an_error(tmp_path):
    store = _store_with(tmp_path, 1)
    _download(store, 2)  # downloaded, not admitted
    with pytest.raises(FileNotFoundError, match="serial 2 is not a kept release"):
        store.activate(2)
    _assert_whole(store, 1, None)


def test_a_download_is_kept_across_restarts(tmp_path):
    store = ModelStore(tmp_path, MODEL)
    (store.incoming(4) / "model.tflite.part").write_bytes(b"half")
    assert (ModelStore(tmp_path, MODEL).incoming(4) / "model.tflite.part").read_bytes() == b"half"
    store.discard_incoming(4)
    assert not (store.dir / "incoming" / "4").exists()


def test_admit_is_idempotent(tmp_path):
    store = _store_with(tmp_path, 1)
    assert store.admit(1) == store.release_dir(1)  # nothing in incoming: already admitted
    _download(store, 1)  # the same release fetched again
    assert store.admit(1) == store.release_dir(1)
    assert not (store.dir / "incoming" / "1").exists()
    _assert_whole(store, 1, None)


def test_admit_refuses_other_files_under_a_kept_serial(tmp_path):
    store = _store_with(tmp_path, 1)
    _download(store, 1, {**_files(1), "model.tflite": b"another model"})
    with pytest.raises(Refused) as refused:
        store.admit(1)
    assert refused.value.code == SERIAL_MISMATCH
    _assert_whole(store, 1, None)


def test_admit_refuses_a_partial_file_or_a_link_and_leaves_the_download(tmp_path):
    store = ModelStore(tmp_path, MODEL)
    incoming = _download(store, 1)
    (incoming / "labels.txt.part").write_bytes(b"half")
    with pytest.raises(Refused) as refused:
        store.admit(1)
    assert (refused.value.code, refused.value.final) == (DOWNLOAD, False)
    (incoming / "labels.txt.part").unlink()
    (incoming / "labels.txt").symlink_to("/etc/passwd")
    with pytest.raises(Refused) as refused:
        store.admit(1)
    assert refused.value.code == UNSAFE_NAME
    assert store.kept() == [] and (incoming / "model.tflite").exists()


def test_admit_without_a_download_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        ModelStore(tmp_path, MODEL).admit(7)


@pytest.mark.parametrize("serial", [-1, True, "3", 2.0])
def test_a_serial_is_a_non_negative_integer(tmp_path, serial):
    with pytest.raises(ValueError):
        ModelStore(tmp_path, MODEL).incoming(serial)


@pytest.mark.parametrize("model", ["", ".", "..", "a/b", "../etc", "a\\b", "a\0b", "x" * 256])
def test_an_unsafe_model_name_is_refused_before_anything_is_made(tmp_path, model):
    with pytest.raises(Refused) as refused:
        ModelStore(tmp_path / "fleet", model)
    assert refused.value.code == UNSAFE_NAME
    assert not (tmp_path / "fleet").exists()


# --- revert ------------------------------------------------------------------------------------

def test_revert_goes_back_release_by_release_then_refuses(tmp_path):
    store = _store_with(tmp_path, 1, 2, 3)
    assert store.revert() == 2
    _assert_whole(store, 2, 1)
    assert store.revert() == 1
    _assert_whole(store, 1, None)
    with pytest.raises(Refused) as refused:
        store.revert()
    assert refused.value.code == OPERATOR and "no previous release" in refused.value.message
    _assert_whole(store, 1, None)


def test_revert_without_a_previous_release_is_refused(tmp_path):
    store = _store_with(tmp_path, 1)
    with pytest.raises(Refused) as refused:
        store.revert()
    assert refused.value.code == OPERATOR
    with pytest.raises(Refused):
        ModelStore(tmp_path / "empty", MODEL).revert()


def test_a_release_activated_below_the_current_one_goes_back_below_it_never_forward(tmp_path):
    """Sent down from 4 to a kept 2 (an aborted rollout's restored entry), a rollback goes on down to
    1, and then to the configured files: never up to 4, the release the abort left."""
    store = _store_with(tmp_path, 1, 2, 3, 4)
    store.activate(2)
    _assert_whole(store, 2, 1)
    assert store.revert() == 1
    _assert_whole(store, 1, None)
    assert store.back() is None and store.current() is None


def test_a_rollback_skips_the_releases_the_node_refused(tmp_path):
    store = _store_with(tmp_path, 1, 2)
    _download(store, 3)
    store.admit(3)
    store.activate(3, refused={2})  # 2 kept but refused (its canary failed): a rollback from 3 goes to 1
    _assert_whole(store, 3, 1)
    assert store.back(refused={2}) == 1
    _assert_whole(store, 1, None)


# --- prune -------------------------------------------------------------------------------------

def test_prune_removes_the_oldest_releases_and_stale_downloads(tmp_path):
    store = _store_with(tmp_path, 1, 2, 3, 4, 5)
    _download(store, 3)
    _download(store, 6)
    assert store.prune(2) == [1, 2, 3]
    assert store.kept() == [4, 5]
    assert sorted(p.name for p in (store.dir / "incoming").iterdir()) == ["6"]
    _assert_whole(store, 5, 4)


def test_prune_never_removes_current_or_previous(tmp_path):
    store = _store_with(tmp_path, 1, 2, 3, 4, 5)
    store.revert()
    store.revert()  # current 3, previous 2
    assert store.prune(1) == [1, 4, 5]
    assert store.kept() == [2, 3]
    _assert_whole(store, 3, 2)
    assert store.prune(0) == []


# --- state.json --------------------------------------------------------------------------------

def test_state_round_trips_and_reads_as_empty_when_missing(tmp_path):
    store = ModelStore(tmp_path, MODEL)
    assert store.read_state() == {}
    state = {"rev": {"node": 12}, "rejected": [{"serial": 5, "code": "gate"}]}
    store.write_state(state)
    assert ModelStore(tmp_path, MODEL).read_state() == state
    assert stat.S_IMODE((store.dir / "state.json").stat().st_mode) == 0o600


@pytest.mark.parametrize("content", [b'{"rev": {"node": 1', b"[1, 2]", b"\xff\xfe"])
def test_a_corrupt_state_reads_as_empty_and_is_moved_aside(tmp_path, caplog, content):
    store = ModelStore(tmp_path, MODEL)
    (store.dir / "state.json").write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="daemon.fleet.node.store"):
        assert store.read_state() == {}
    assert (store.dir / "state.json.corrupt").read_bytes() == content
    assert not (store.dir / "state.json").exists()
    assert "state.json cannot be read" in caplog.text
    store.write_state({"rev": {}})
    assert store.read_state() == {"rev": {}}


# --- the kill points ---------------------------------------------------------------------------

# (current, previous) after recover() when the child admitting and activating release 3 over
# current 2 (previous 1) is killed at each step: before the journal, the old release; once the
# journal is written, the swap is rolled forward to the new one.
ACTIVATE_KILLED = {
    MID_ADMIT: (2, 1),
    AFTER_JOURNAL: (3, 2),
    AFTER_PREVIOUS: (3, 2),
    AFTER_CURRENT: (3, 2),
    AFTER_UNJOURNAL: (3, 2),
}
# The same for a child reverting current 3 (previous 2, kept 1 2 3): rolled forward to 2 (previous 1).
REVERT_KILLED = {AFTER_JOURNAL: (2, 1), AFTER_PREVIOUS: (2, 1), AFTER_CURRENT: (2, 1), AFTER_UNJOURNAL: (2, 1)}


def test_every_kill_point_is_tested():
    assert set(ACTIVATE_KILLED) == set(KILL_STEPS)


@pytest.mark.parametrize("step", KILL_STEPS)
def test_a_kill_during_admit_and_activate_recovers_to_one_whole_release(tmp_path, step):
    _store_with(tmp_path, 1, 2)
    assert _run_child(tmp_path, "activate", step) == -signal.SIGKILL
    store = ModelStore(tmp_path, MODEL)
    said = store.recover()
    current, previous = ACTIVATE_KILLED[step]
    _assert_whole(store, current, previous)
    if step in (MID_ADMIT, AFTER_UNJOURNAL):
        assert said is None  # nothing was under way: the old release, or the finished swap
    else:
        assert "finished activate to serial 3" in said
    assert store.recover() is None


def test_a_download_killed_mid_admit_is_admitted_on_the_next_try(tmp_path):
    _store_with(tmp_path, 1, 2)
    assert _run_child(tmp_path, "activate", MID_ADMIT) == -signal.SIGKILL
    store = ModelStore(tmp_path, MODEL)
    store.recover()
    assert store.kept() == [1, 2]
    assert {p.name: p.read_bytes() for p in store.incoming(3).iterdir()} == _files(3)
    store.admit(3)
    store.activate(3)
    _assert_whole(store, 3, 2)


@pytest.mark.parametrize("step", sorted(REVERT_KILLED))
def test_a_kill_during_revert_recovers_to_one_whole_release(tmp_path, step):
    _store_with(tmp_path, 1, 2, 3)
    assert _run_child(tmp_path, "revert", step) == -signal.SIGKILL
    store = ModelStore(tmp_path, MODEL)
    store.recover()
    _assert_whole(store, *REVERT_KILLED[step])


@pytest.mark.parametrize("step", [AFTER_PREVIOUS, AFTER_CURRENT, AFTER_UNJOURNAL])
def test_a_recovery_killed_on_its_way_is_finished_by_the_next(tmp_path, step):
    _store_with(tmp_path, 1, 2)
    assert _run_child(tmp_path, "activate", AFTER_JOURNAL) == -signal.SIGKILL
    assert _run_child(tmp_path, "recover", step) == -signal.SIGKILL
    store = ModelStore(tmp_path, MODEL)
    store.recover()
    _assert_whole(store, 3, 2)


def test_a_journal_whose_release_is_gone_is_undone(tmp_path):
    _store_with(tmp_path, 1, 2)
    assert _run_child(tmp_path, "activate", AFTER_PREVIOUS) == -signal.SIGKILL
    store = ModelStore(tmp_path, MODEL)
    os.rename(store.dir / "releases" / "3", tmp_path / "taken-away")  # by hand: the store never does this
    assert "undid activate to serial 3" in store.recover()
    _assert_whole(store, 2, 1)


def test_a_journal_that_is_not_one_is_moved_aside(tmp_path):
    store = _store_with(tmp_path, 1, 2)
    (store.dir / "journal.json").write_text('{"op": "activate", "to": ')
    store.recover()
    assert (store.dir / "journal.json.corrupt").exists()
    _assert_whole(store, 2, 1)


# --- recover's repairs -------------------------------------------------------------------------

def test_a_current_naming_a_missing_release_is_repaired_to_the_newest_kept(tmp_path):
    store = _store_with(tmp_path, 1, 2)
    (store.dir / "current").unlink()
    (store.dir / "current").symlink_to("releases/9")
    assert store.current() is None
    assert "now 2" in store.recover()
    _assert_whole(store, 2, 1)


def test_a_previous_naming_a_missing_release_is_removed(tmp_path):
    store = _store_with(tmp_path, 1, 2)
    (store.dir / "previous").unlink()
    (store.dir / "previous").symlink_to("releases/0")
    assert "previous" in store.recover()
    _assert_whole(store, 2, None)


def test_a_current_with_no_release_left_is_removed(tmp_path):
    store = ModelStore(tmp_path, MODEL)
    (store.dir / "current").symlink_to("releases/1")
    store.recover()
    assert not (store.dir / "current").is_symlink() and store.current() is None


def test_stray_temporary_names_are_removed(tmp_path):
    store = _store_with(tmp_path, 1)
    os.symlink("releases/1", store.dir / f"{TMP_PREFIX}current.4242")
    (store.dir / f"{TMP_PREFIX}state.json.4242").write_text("{")
    (store.dir / f"{TMP_PREFIX}removed.7").mkdir()
    said = store.recover()
    assert all(f"removed {TMP_PREFIX}{name}" in said for name in ("current.4242", "state.json.4242", "removed.7"))
    _assert_whole(store, 1, None)


def test_the_journal_names_the_swap_while_it_is_under_way(tmp_path):
    _store_with(tmp_path, 1, 2)
    assert _run_child(tmp_path, "activate", AFTER_JOURNAL) == -signal.SIGKILL
    journal = json.loads((tmp_path / MODEL / "journal.json").read_text())
    assert journal == {"op": "activate", "to": 3, "from": 2, "prev_before": 1, "prev_after": 2}
