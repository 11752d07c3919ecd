"""The TFLite runtime's INFO banner stays off stderr; native errors and our own lines do not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from daemon.model import native_stderr
from daemon.model.native_stderr import quiet_native_info

ROOT = Path(__file__).resolve().parents[2]
BANNER = b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\n"


@pytest.fixture(autouse=True)
def banner_not_seen(monkeypatch):
    monkeypatch.setattr(native_stderr, "_banner_seen", False)


def test_native_info_is_dropped_and_everything_else_written_back_in_order(capfd):
    os.write(2, b"before\n")
    with quiet_native_info():
        os.write(2, BANNER + b"ERROR: a real native problem\n")
        os.write(2, b"another thread's line meanwhile\n")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "before\nERROR: a real native problem\nanother thread's line meanwhile\nafter\n"


def test_fd_2_is_restored_even_when_the_block_raises(capfd):
    with pytest.raises(ValueError), quiet_native_info():
        os.write(2, b"ERROR: then it failed\n")
        raise ValueError("boom")
    os.write(2, b"still stderr\n")
    assert capfd.readouterr().err == "ERROR: then it failed\nstill stderr\n"


def test_once_the_banner_was_seen_nothing_is_redirected(capfd):
    with quiet_native_info():
        os.write(2, BANNER)
    assert native_stderr._banner_seen
    with quiet_native_info():  # the runtime prints it once per process: no more redirection
        os.write(2, BANNER)
    assert capfd.readouterr().err == BANNER.decode()


def test_check_config_prints_one_line_on_stdout_and_nothing_on_stderr():
    done = subprocess.run([sys.executable, "-m", "daemon", "check-config", "--config", "config.yaml"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.count("\n") == 1 and "valid" in done.stdout
