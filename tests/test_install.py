"""scripts/install.sh into a temporary root: files, modes, a config the service user can read and that checks."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("runuser") is None or shutil.which("git") is None
                                or not (ROOT / ".git").exists(),
                                reason="install.sh runs as root, with runuser and a git checkout")


@pytest.fixture
def staging():
    # Not pytest's tmp_path: its parents are 0700, and the service user must reach the files.
    path = Path(tempfile.mkdtemp(prefix="edge-inferd-install-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_install_into_a_root_then_uninstall(staging):
    run = subprocess.run([str(ROOT / "scripts/install.sh"), "--root", str(staging), "--no-venv", "--no-systemctl"],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "valid (4 model(s), 7 route(s))" in run.stdout
    config = staging / "etc/edge-inferd/config.yaml"
    assert oct(config.stat().st_mode & 0o777) == "0o644"
    assert str(staging / "opt/edge-inferd/models/activity/model.tflite") in config.read_text()
    assert (staging / "etc/systemd/system/edge-inferd.service").read_text() == \
        (ROOT / "systemd/edge-inferd.service").read_text()
    assert not (staging / "opt/edge-inferd/tests").exists()
    gone = subprocess.run([str(ROOT / "scripts/uninstall.sh"), "--root", str(staging), "--purge"],
                          capture_output=True, text=True)
    assert gone.returncode == 0, gone.stderr
    assert not (staging / "opt/edge-inferd").exists() and not (staging / "etc/edge-inferd").exists()
    assert not (staging / "etc/systemd/system/edge-inferd.service").exists()
