"""daemon/fleet/node/durable.py on real files: each write replaces its name whole and leaves no temporary."""

from __future__ import annotations

import json
import os
import stat

from daemon.fleet.node.durable import TMP_PREFIX, remove, replace_link, temporary, write_json


def _temporaries(directory):
    return [p.name for p in directory.iterdir() if p.name.startswith(TMP_PREFIX)]


def test_write_json_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "state.json"
    write_json(path, {"rev": 1})
    write_json(path, {"rev": 2})
    assert json.loads(path.read_text()) == {"rev": 2}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert _temporaries(tmp_path) == []


def test_the_temporary_name_sits_next_to_the_target_and_names_the_writer(tmp_path):
    assert temporary(tmp_path / "current") == tmp_path / f"{TMP_PREFIX}current.{os.getpid()}"


def test_replace_link_repoints_a_link_and_survives_a_leftover_temporary(tmp_path):
    link = tmp_path / "current"
    replace_link(link, "releases/1")
    os.symlink("releases/9", temporary(link))  # as a writer killed between symlink and rename leaves it
    replace_link(link, "releases/2")
    assert os.readlink(link) == "releases/2"
    assert _temporaries(tmp_path) == []


def test_remove_is_quiet_about_a_missing_name(tmp_path):
    path = tmp_path / "journal.json"
    remove(path)
    path.write_text("{}")
    remove(path)
    assert not path.exists()
