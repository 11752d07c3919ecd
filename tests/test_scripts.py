"""The measurement scripts behind docs/performance.md still run (smoke: tiny sizes, no figures checked)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.real_models import real_model

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> str:
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


def test_profile_worker_runs():
    assert "worker path" in _run("tools/dev/profile_worker.py", "--n", "20")
    out = _run("tools/dev/profile_worker.py", "--n", "20", "--route", "gunpoint", "--serving")
    assert "serving at batch 1" in out and "worker path" in out


def test_trace_latency_times_every_request_at_each_point():
    out = _run("tools/dev/trace_latency.py", "--duration", "1")
    counts = out.split("; the last")[0].splitlines()[-1]  # "1050 read, 1050 take, 1050 reply, 1053 published ..."
    read, taken, replied, published = (int(part.split()[0]) for part in counts.split(", "))
    assert read == taken == replied >= 1000  # 1,000/s for 1 s (and the warm-up), each request at each point
    assert published >= replied  # every reply written (and the status and stats)
    for stage in ("read -> taken", "taken -> reply queued", "reply queued -> written", "read -> written"):
        assert stage in out


def test_bench_reuse_runs_and_reports_every_epsilon():
    rows = [json.loads(line) for line in _run("benchmarks/bench_reuse.py", "--step", "0.2", "--repeat", "1",
                                              "--eps", "1.0", "--batch", "1").splitlines()]
    assert {(r["route"], r["eps"]) for r in rows} == {(route, eps) for route in ("activity-raw", "appliance-raw")
                                                      for eps in (None, 1.0)}
    assert all(0.0 <= r["hit_rate"] <= 1.0 and r["cpu_us_per_request"] > 0 for r in rows)


def test_measure_cascade_runs_and_reports_the_three_ways():
    report = json.loads(_run("benchmarks/measure_cascade.py", "--repeat", "1"))
    assert {"fast", "large", "cascade"} <= report.keys() and report["n"] == 100
    assert 0.0 <= report["escalated_share"]["all"] <= 1.0


def test_bench_detect_runs_the_naive_script_and_the_daemon_on_camera_frames(tmp_path):
    models = real_model("ssd_mobilenet_v2_coco_quant.tflite").parent
    table = _run("benchmarks/bench_detect.py", "--frames", "3", "--rounds", "1", "--rates", "0.5x", "--duration", "0.5",
                 "--warmup", "1", "--out", str(tmp_path), "--models", str(models))
    assert "daemon-t2" in table
    report = json.loads((tmp_path / "bench_detect.json").read_text())
    assert report["errors"] == [] and report["rounds_run"] == 1
    (round_one,) = report["rounds"]
    assert set(round_one) == {"naive", "daemon-t1", "daemon-t2"}
    for name, measured in round_one.items():
        drain, (point,) = measured["drain"], measured["openloop"]
        assert drain["results"] == drain["sent"] == 3, name  # replies with detections, none shed or lost
        assert drain["cache_hits"] == 0 and drain["top_label_matches_photo"] == 3, name
        assert drain["images_per_s"] > 0 and drain["cpu_ms_per_image"] > 0 and drain["latency_ms"]["p99"] > 0
        assert point["results"] == point["sent"] >= 1 and point["latency_ms"]["p50"] > 0, name


def test_drift_demo_warns_on_the_shifted_steps_only():
    out = _run("benchmarks/drift_demo.py", "--replays", "2", "--plot", "")
    activity = [line.split(" | ") for line in out.splitlines() if line.startswith("| activity |")]
    assert len(activity) == 6 and float(activity[0][4]) < 0.1 and float(activity[4][4]) > 0.25  # labels PSI
    assert "cost per answer on the reply path" in out


def test_repro_lost_burst_runs_and_compares_the_daemons_count_with_the_collectors(tmp_path):
    out = _run("tools/dev/repro_lost_burst.py", "--requests", "200", "--runs", "1", "--keep", str(tmp_path / "log"))
    assert "collector heard 200 of 200; the daemon received 200, results 200" in out
    assert "no run lost a reply in 1" in out


def test_bench_http_runs_the_three_targets_and_gets_results_only(tmp_path):
    assert "median" in _run("benchmarks/bench_http.py", "--rounds", "1", "--duration", "0.5", "--warmup", "0.5",
                            "--rate", "100", "--connections", "4", "--json", str(tmp_path / "http.json"))
    report = json.loads((tmp_path / "http.json").read_text())
    (round_one,) = report["rounds"]
    for target in ("http", "mqtt", "echo"):
        row = round_one[target]
        assert row["sent"] == 50 and row["results"] == 50 and row["hits"] == 0 and row["lost"] == 0, row
        assert row["errors"] == {} and row["cpu_us"] >= 0  # a 0.5 s window may hold no clock tick
    assert round_one["mqtt"]["broker_cpu_us"] >= 0 and round_one["ratios"]["http/echo p50_ms"] > 0


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng (scripts/setup.sh installs it)")
def test_bench_stream_audio_answers_every_window_alike_in_both_consumers(tmp_path):
    _run("benchmarks/bench_stream_audio.py", "--devices", "2", "--seconds", "3", "--rounds", "1",
         "--out", str(tmp_path / "audio.json"))
    (round_one,) = json.loads((tmp_path / "audio.json").read_text())["rounds"]
    for kind in ("daemon", "naive"):
        assert round_one[kind]["windows"] == round_one[kind]["expected"] == 8, round_one[kind]  # 4 a microphone
    assert round_one["daemon_vs_naive"]["within_tolerance"] and round_one["daemon_vs_naive"]["windows_compared"] == 8
