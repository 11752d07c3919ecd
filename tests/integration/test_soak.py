"""`edge-inferd bench soak` end to end, as a smoke (about 7 s): a few seconds of open loop, every request answered."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.integration.conftest import ROOT


def test_a_short_soak_answers_every_request_and_reports_the_process_figures(tmp_path):
    out = tmp_path / "soak.json"
    done = subprocess.run([sys.executable, "-m", "daemon", "bench", "soak", "--minutes", "0.1", "--load", "0.3",
                           "--capacity-requests", "500", "--out", str(out), "--config", str(ROOT / "config.yaml")],
                          capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path)
    assert out.exists(), done.stdout + done.stderr
    report = json.loads(out.read_text())
    load = report["load"]
    assert load["sent"] > 0 and load["answered"] == load["sent"] and load["lost"] == 0, load
    assert load["other_errors"] == 0 and load["duplicates"] == 0
    assert report["capacity"]["rps"] > 0 and report["samples"]
    assert {"rss_mb", "fds", "threads"} <= set(report["resources"])
    assert report["checks"]["no request unanswered"] is True, report["checks"]
