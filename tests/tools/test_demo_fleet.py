"""`edge-inferd demo --fleet` (`./scripts/demo.sh --fleet`), run as a user runs it: three real
daemons, a rollout in waves that completes, a bad release that the gate stops on the first wave."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEMO_LIMIT_S = 300


@pytest.mark.integration
def test_the_fleet_demo_rolls_a_release_out_and_the_gate_stops_the_bad_one():
    done = subprocess.run([sys.executable, "-m", "daemon", "demo", "--fleet"], cwd=ROOT, capture_output=True,
                          text=True, timeout=DEMO_LIMIT_S)
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    assert "rollout of activity serial 2 completed: 3 of 3 nodes assigned; 3 active" in out
    assert "gw1: failed gate: route 'activity': accuracy" in out
    assert "rollout of activity serial 3 aborted: 1 of 3 nodes assigned; 1 failed" in out
    tables = [line for line in out.splitlines() if line.startswith(("gw1 ", "gw2 ", "gw3 "))]
    assert len(tables) == 6 and all(" 1.1.0 " in line and " active " in line for line in tables)
    assert "gw2: assigned http" in out and out.count("serial 3, rev") == 1  # only gw1 heard of serial 3
