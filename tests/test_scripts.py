"""The measurement scripts behind docs/performance.md still run (smoke: tiny sizes, no figures checked)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> str:
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


def test_profile_worker_runs():
    assert "worker path" in _run("scripts/profile_worker.py", "--n", "20")


def test_bench_reuse_runs_and_reports_every_epsilon():
    rows = [json.loads(line) for line in _run("scripts/bench_reuse.py", "--step", "0.2", "--repeat", "1",
                                              "--eps", "1.0", "--batch", "1").splitlines()]
    assert {(r["route"], r["eps"]) for r in rows} == {(route, eps) for route in ("activity-raw", "appliance-raw")
                                                      for eps in (None, 1.0)}
    assert all(0.0 <= r["hit_rate"] <= 1.0 and r["cpu_us_per_request"] > 0 for r in rows)


def test_measure_cascade_runs_and_reports_the_three_ways():
    report = json.loads(_run("scripts/measure_cascade.py", "--repeat", "1"))
    assert {"fast", "large", "cascade"} <= report.keys() and report["n"] == 100
    assert 0.0 <= report["escalated_share"]["all"] <= 1.0
