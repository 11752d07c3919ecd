"""The systemd unit: hardened to a score of 1.5 or better, and the runtime survives its W^X rule."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UNIT = ROOT / "systemd/edge-inferd.service"
MAX_EXPOSURE = 1.5

# Runs the bundled models after PR_SET_MDWE (refuse writable+executable memory), the rule
# behind the unit's MemoryDenyWriteExecute=yes; exits 3 where the kernel lacks it (< 6.3).
MDWE_PROBE = """
import ctypes, sys
import numpy as np
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(65, 1, 0, 0, 0) != 0:
    sys.exit(3)
from daemon.model.runtime import Model
for name in ("activity", "appliance"):
    model = Model(f"models/{name}/model.tflite", max_batch=8)
    model.warm_up()
    assert model.infer(np.zeros((3,) + model.sample_shape, np.float32)).shape[0] == 3
"""


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_the_unit_scores_1_5_or_better_in_systemd_analyze_security():
    out = subprocess.run(["systemd-analyze", "security", "--offline=true", str(UNIT)], capture_output=True,
                         text=True, check=False)
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", out.stdout)
    assert found, out.stdout[-2000:] + out.stderr[-2000:]
    assert float(found.group(1)) <= MAX_EXPOSURE, out.stdout[-3000:]


def test_the_unit_asks_for_what_the_daemon_provides():
    unit = UNIT.read_text()
    for line in ("Type=notify", "WatchdogSec=", "RestartPreventExitStatus=78", "StartLimitBurst=",
                 "StateDirectory=edge-inferd", "CacheDirectory=edge-inferd", "ExecReload=/bin/kill -HUP $MAINPID",
                 "MemoryDenyWriteExecute=yes"):
        assert line in unit, line


def test_the_runtime_runs_without_writable_executable_memory():
    proc = subprocess.run([sys.executable, "-c", MDWE_PROBE], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode == 3:
        pytest.skip("this kernel has no PR_SET_MDWE (Linux < 6.3)")
    assert proc.returncode == 0, proc.stderr[-3000:]
