"""`edge-inferd bench e2e --quick` end to end: every consumer and phase, sane counts.

Counts only: timings on a shared machine decide nothing here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from daemon.tools.bench.e2e import CONSUMERS, WAIT_500_CONSUMER
from tests.integration.conftest import ROOT

BENCH_TIMEOUT_S = 180
REQUESTS = 120

pytestmark = pytest.mark.skipif(shutil.which("mosquitto_pub") is None or shutil.which("mosquitto_sub") is None,
                                reason="bench e2e needs the mosquitto C clients: apt-get install mosquitto-clients")


def _all_answered(row: dict, sent: int, overload: bool = False) -> None:
    assert row["sent"] == sent
    assert row["answered"] + row["lost"] == sent
    assert row["results"] + row["overloaded"] + row["expired"] + row["other_errors"] == row["answered"]
    assert row["other_errors"] == 0
    if not overload:  # at 2x capacity the old daemon loses requests; the bench reports it, the test does not judge
        assert row["lost"] == 0, row


def test_bench_e2e_quick(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "daemon", "bench", "e2e", "--quick", "--requests", str(REQUESTS),
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=BENCH_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "bench-e2e.json").read_text())
    names = [c.name for c in CONSUMERS]
    assert list(results["drain"]) == names
    for row in results["drain"].values():
        _all_answered(row, REQUESTS)
        assert row["rps"] > 0 and row["cpu_us_per_request"] >= 0
    assert list(results["openloop"]) == [*names, WAIT_500_CONSUMER.name]
    for points in results["openloop"].values():
        for point in points:
            _all_answered(point, point["sent"], overload=point["rate_spec"] == "2x")
            assert point["answered"] > 0
    cache = results["cache"]
    assert cache["all_repeat"]["cache_hits"] == REQUESTS  # the same data again: every request a hit
    assert 0 < cache["mixed"]["cache_hits"] <= cache["mixed"]["repeats_sent"]
    daemons = [c.name for c in CONSUMERS if c.kind == "daemon"]
    assert list(results["batching"]) == daemons
    for row in results["batching"].values():
        _all_answered(row, REQUESTS)
    assert "drain" in proc.stdout and "batching ratio" in proc.stdout
