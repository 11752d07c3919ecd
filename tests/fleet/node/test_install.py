"""daemon/fleet/node/install.py's last look at a release's files before the store admits them."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import pytest

from daemon.fleet.node.install import check_digests
from daemon.fleet.release.refusal import SHA256_MISMATCH, Refused
from daemon.fleet.release.release import FileEntry


def test_a_file_whose_bytes_changed_after_its_download_is_refused_and_removed(tmp_path):
    files = {"model.tflite": b"model bytes", "labels.txt": b"a\nb\n"}
    manifest = SimpleNamespace(files=tuple(FileEntry(name, len(data), hashlib.sha256(data).hexdigest())
                                           for name, data in files.items()))
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    check_digests(tmp_path, manifest)  # as signed: nothing to say
    (tmp_path / "model.tflite").write_bytes(b"model bytez")  # the same size, one byte changed on the card
    with pytest.raises(Refused) as refused:
        check_digests(tmp_path, manifest)
    assert refused.value.code == SHA256_MISMATCH and "model.tflite" in refused.value.message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["labels.txt"]  # a retry fetches it again
