"""The demo's printout for each output kind (classify, anomaly, values, detect): the first
replies per route, "wrong" marks, and a summary per kind that says its round trips are
measured with WINDOW requests outstanding; the camera it adds when the fetched SSD and
photos are there; and the whole demo on a real broker and daemon. (./scripts/demo.sh runs it all.)"""

from __future__ import annotations

import io
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from PIL import Image

from daemon.config.loader import load_config
from daemon.config.reader import absolute_paths
from daemon.pipeline.scoring import roc_auc
from daemon.tools import demo_camera
from daemon.tools.demo import FIRST_ANSWERS, WINDOW, answer_lines, replay, run_demo, summary_lines
from daemon.tools.demo_kinds import ANOMALY_SAMPLES, VALUES_SAMPLES, RouteRun, balanced, sample_indices
from tests.real_models import real_model

ROOT = Path(__file__).resolve().parents[2]


def _route(name: str = "activity", kind: str = "classify") -> SimpleNamespace:
    return SimpleNamespace(name=name, kind=kind)


def _answered(run: RouteRun, replies: list[dict]) -> RouteRun:
    for i, reply in enumerate(replies):
        run.sent_at[i] = 0.0
        run.answers[i] = {"latency_ms": 0.5 + i % 2, "cached": False, **reply}
        run.rtt_ms[i] = 20.0 + i
    return run


def _run(n: int, wrong: set[int] = frozenset()) -> RouteRun:
    labels = ["sitting", "walking"]
    run = RouteRun(_route(), np.zeros((n, 1)), np.zeros(n, dtype=int), labels)
    return _answered(run, [{"label": labels[1 if i in wrong else 0], "score": 0.9} for i in range(n)])


def test_first_replies_then_how_many_more():
    lines = answer_lines(_run(12, wrong={1}))
    assert len(lines) == FIRST_ANSWERS + 1
    assert " wrong walking " in lines[1] and "expected sitting" in lines[1] and "MISS" not in lines[1]
    assert " ok " in lines[0] and "cached=false" in lines[0]
    assert lines[-1].endswith(f"{12 - FIRST_ANSWERS} more (-v prints every reply)")


def test_verbose_prints_every_reply():
    assert len(answer_lines(_run(12), verbose=True)) == 12
    assert len(answer_lines(_run(3))) == 3  # nothing left out, no "more" line


def test_summary_states_the_concurrency_and_the_daemons_own_latency():
    header, line = summary_lines({"activity": _run(10, wrong={0})})
    assert f"{WINDOW} requests outstanding" in header
    assert "accuracy 0.900" in line and "answered 10/10 (0 errors)" in line
    assert "daemon p50 1.0 ms" in line and "round trip p50 24.5 ms" in line


def test_an_error_reply_is_printed_and_counted():
    run = _run(3)
    run.answers[2] = {"error": {"code": "bad_shape", "message": "data has 3 values"}}
    assert "ERROR bad_shape: data has 3 values" in answer_lines(run)[2]
    assert "accuracy 0.667" in summary_lines({"activity": run})[1] and "(1 errors)" in summary_lines({"a": run})[1]


# --- anomaly


def _anomaly_run(y: list[int], scores: list[float], threshold: float = 0.5) -> RouteRun:
    run = RouteRun(_route("load", "anomaly"), np.zeros((len(y), 24)), np.array(y), [])
    return _answered(run, [{"anomaly_score": s, "anomaly": s > threshold, "threshold": threshold} for s in scores])


def test_anomaly_lines_show_score_flag_and_what_the_day_is():
    lines = answer_lines(_anomaly_run([0, 1, 1], [0.1, 0.9, 0.2]))
    assert "ok    anomaly_score 0.1000  anomaly=false  expected normal" in lines[0]
    assert "ok    anomaly_score 0.9000  anomaly=true   expected anomalous" in lines[1]
    assert "wrong anomaly_score 0.2000  anomaly=false  expected anomalous" in lines[2]


def test_anomaly_summary_is_the_roc_auc_and_the_share_flagged_of_each_class():
    y, scores = [0, 0, 0, 0, 1, 1, 1, 1], [0.1, 0.2, 0.6, 0.3, 0.9, 0.4, 0.8, 0.7]
    line = summary_lines({"load": _anomaly_run(y, scores)})[1]
    auc = roc_auc(np.array(y), np.array(scores))
    assert f"ROC-AUC {auc:.3f}" in line and auc == pytest.approx(15 / 16)  # 0.4 is below one normal day
    assert "flagged 25% of normal, 75% of anomalous days" in line and "answered 8/8 (0 errors)" in line


def test_anomaly_summary_without_both_classes_or_a_threshold():
    assert "ROC-AUC n/a" in summary_lines({"load": _anomaly_run([0, 0], [0.1, 0.2])})[1]
    run = _anomaly_run([0, 1], [0.1, 0.9])
    for reply in run.answers.values():
        del reply["anomaly"], reply["threshold"]
    assert "anomaly=-" in answer_lines(run)[0] and "flagged: no threshold set" in summary_lines({"load": run})[1]


def test_anomaly_samples_are_balanced_and_capped():
    y = np.array([1] * 300 + [0] * 50 + [1] * 10)
    keep = sample_indices("anomaly", y)
    assert keep.size == ANOMALY_SAMPLES and np.all(np.diff(keep) > 0)
    assert (y[keep] == 0).sum() == 50 and (y[keep] == 1).sum() == 150  # all the normals there are, then anomalous
    assert list(balanced(np.array([1, 1, 0, 1, 0, 0]), 4)) == [0, 1, 2, 4]
    assert sample_indices("anomaly", y, limit=10).size == 10 and y[sample_indices("anomaly", y, limit=10)].sum() == 5
    assert list(sample_indices("values", y)) == list(range(VALUES_SAMPLES))
    assert list(sample_indices("classify", y, limit=3)) == [0, 1, 2] and sample_indices("classify", y).size == y.size


# --- values


def _values_run(lengths: list[int]) -> RouteRun:
    run = RouteRun(_route("load-profile", "values"), np.zeros((len(lengths), 24)), np.zeros(len(lengths)), [],
                   value_sizes={"out:0": 24})
    return _answered(run, [{"values": {"out:0": [0.25 * k for k in range(n)]}} for n in lengths])


def test_values_lines_show_the_first_values():
    line = answer_lines(_values_run([24]))[0]
    assert "out:0 [24]: 0.000 0.250 0.500 0.750 ..." in line and "daemon" in line


def test_values_summary_checks_every_reply_has_the_outputs_length():
    assert "values of the right length in 3/3 replies (out:0 [24])" in summary_lines({"v": _values_run([24] * 3)})[1]
    line = summary_lines({"v": _values_run([24, 23, 24])})[1]
    assert "values of the right length in 2/3 replies" in line and "answered 3/3" in line


# --- detect


def _detect_run(found: list[list[str]]) -> RouteRun:
    expected = ["person", "cat", "cup", "person", "cat", "cup"][:len(found)]
    names = [f"photo{i} 640x480" for i in range(len(found))]
    box = {"x_min": 1.2, "y_min": 2.0, "x_max": 300.4, "y_max": 479.9}
    run = RouteRun(_route("camera", "detect"), [b"jpeg"] * len(found), np.array(expected), [], samples=names)
    return _answered(run, [{"detections": [{"label": label, "index": 0, "score": 0.875, "box": box}
                                           for label in labels]} for labels in found])


def test_detect_lines_show_every_frame_with_what_was_found():
    lines = answer_lines(_detect_run([["person"], ["dog", "cat"], [], ["person"], ["cat"], ["cup", "dining table"]]))
    assert len(lines) == 6 > FIRST_ANSWERS  # every frame, not the first few
    assert lines[0].startswith("camera        #0   ok    photo0 640x480") and "expected person" in lines[0]
    assert "found person 0.88 (1,2)-(300,480)" in lines[0]
    assert " wrong " in lines[1] and "found dog 0.88 (1,2)-(300,480); cat 0.88" in lines[1]  # cat is not on top
    assert " wrong " in lines[2] and "found nothing" in lines[2]


def test_detect_summary_is_found_over_sent():
    line = summary_lines({"camera": _detect_run([["person"], ["dog", "cat"], ["cup"]])})[1]
    assert "found 2/3 (the expected object is the top detection)" in line and "answered 3/3 (0 errors)" in line


def test_a_skipped_camera_says_why_in_one_summary_line(tmp_path):
    reason = demo_camera.skip_reason(tmp_path)
    lines = summary_lines({"activity": _run(2)}, reason)
    assert len(lines) == 3 and lines[-1] == f"  detect        {reason}"
    assert f"{tmp_path} has none of the fetched models" in reason and "fetch_test_models.sh" in reason


# --- the camera's config and frames


def _fake_cache(path: Path, photos: bool = True) -> Path:
    (path / demo_camera.SSD).write_bytes(b"not read here")
    (path / demo_camera.COCO_LABELS).write_text("0 person\n16 cat\n46 cup\n")
    for photo, _, _ in demo_camera.PHOTOS if photos else ():
        Image.new("RGB", (64, 48), (200, 100, 50)).save(path / photo)
    return path


def test_the_camera_needs_every_fetched_file(tmp_path):
    assert demo_camera.skip_reason(_fake_cache(tmp_path)) is None
    (tmp_path / "chelsea.png").unlink()
    assert "lacks chelsea.png" in demo_camera.skip_reason(tmp_path)


def test_the_config_copy_adds_the_camera_route_and_keeps_every_other_path(tmp_path):
    (tmp_path / "fetched").mkdir()
    (tmp_path / "again").mkdir()
    cache = _fake_cache(tmp_path / "fetched")
    copy_path = demo_camera.with_camera(ROOT / "config.yaml", cache, tmp_path)
    copy = load_config(copy_path, check_models=False)  # the fake SSD is no model
    original = load_config(ROOT / "config.yaml")
    assert [r.name for r in copy.routes] == [r.name for r in original.routes] + ["camera"]
    camera = copy.routes[-1]
    assert (camera.kind, camera.input.resize, camera.input.shape, camera.model) == ("detect", "letterbox",
                                                                                   (300, 300, 3), "ssd")
    assert copy.models["ssd"].path == cache / demo_camera.SSD and copy.models["ssd"].threads == 2
    assert copy.models["activity"].path == original.models["activity"].path  # resolved as from the original
    assert copy.cache.dir == original.cache.dir and copy.mqtt.outbox.dir == original.mqtt.outbox.dir
    assert copy.routes[0].validate_data == original.routes[0].validate_data
    again = load_config(demo_camera.with_camera(copy_path, cache, tmp_path / "again"), check_models=False)
    assert [r.name for r in again.routes].count("camera") == 1  # a detect route already: none added


def test_frames_are_jpegs_of_each_size_naming_the_object_on_top(tmp_path):
    payloads, expected, names = demo_camera.frames(_fake_cache(tmp_path))
    assert expected == ["person", "cat", "cup"] * 2
    assert names[:4] == ["astronaut 640x480", "chelsea 640x480", "coffee 640x480", "astronaut 1280x720"]
    sizes = [Image.open(io.BytesIO(p)).size for p in payloads]
    assert all(p[:2] == b"\xff\xd8" for p in payloads) and sizes == [(640, 480)] * 3 + [(1280, 720)] * 3
    assert demo_camera.frames(tmp_path, limit=2)[2] == names[:2]


def test_the_fetched_models_are_found_in_the_checkout_or_where_the_env_says(monkeypatch, tmp_path):
    monkeypatch.delenv(demo_camera.ENV, raising=False)
    assert demo_camera.models_dir() == ROOT / ".cache" / "test-models"
    monkeypatch.setenv(demo_camera.ENV, str(tmp_path))
    assert demo_camera.models_dir() == tmp_path


# --- the whole demo: a real mosquitto and daemon


def _config(tmp_path: Path) -> Path:
    """config.yaml with its cache and outbox in tmp_path (the checkout's stay untouched)."""
    raw = absolute_paths(yaml.safe_load((ROOT / "config.yaml").read_text()), ROOT)
    raw["cache"]["dir"] = str(tmp_path / "cache")
    raw["mqtt"]["outbox"]["dir"] = str(tmp_path / "outbox")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _summary(out: str) -> dict[str, str]:
    tail = out[out.index("\nsummary:"):]
    return dict(re.findall(r"^  (\S+) +(.*)$", tail, flags=re.M))


def test_the_demo_shows_every_bundled_kind_and_says_why_the_camera_is_skipped(monkeypatch, tmp_path, capsys):
    (tmp_path / "fetched").mkdir()
    monkeypatch.setenv(demo_camera.ENV, str(tmp_path / "fetched"))  # nothing fetched there
    assert run_demo(_config(tmp_path), limit=6) is True
    out = capsys.readouterr().out
    summary = _summary(out)
    assert list(summary) == ["activity", "activity-raw", "appliance", "appliance-raw", "load", "load-profile",
                             "gunpoint", "detect"]
    assert summary["activity"].startswith("accuracy 1.000  answered 6/6 (0 errors)")
    assert re.match(r"ROC-AUC \d\.\d{3}  flagged \d+% of normal, \d+% of anomalous days  answered 6/6 \(0 errors\)",
                    summary["load"])
    assert summary["load-profile"].startswith("values of the right length in 5/5 replies")
    assert re.match(r"accuracy \d\.\d{3}  answered 6/6 \(0 errors\)", summary["gunpoint"])
    assert summary["detect"].startswith(f"skipped: {tmp_path / 'fetched'} has none of the fetched models")
    assert re.search(r"^load +#0 +(ok|wrong) +anomaly_score \d\.\d{4}  anomaly=(true |false)  expected ", out, re.M)
    assert "daemon: stopped with exit code 0; status offline" in out


def test_the_demo_shows_the_camera_on_the_fetched_detector(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv(demo_camera.ENV, str(real_model(demo_camera.SSD).parent))
    for name in demo_camera.FILES:
        real_model(name)  # each checked against the cache's manifest
    assert run_demo(_config(tmp_path), limit=2) is True
    out = capsys.readouterr().out
    assert _summary(out)["camera"].startswith("found 2/2 (the expected object is the top detection)  answered 2/2")
    assert re.search(r"^camera +#0 +ok +astronaut 640x480 +expected person +found person 0\.\d\d \(", out, re.M)
    assert re.search(r"^camera +#1 +ok +chelsea 640x480 +expected cat +found cat ", out, re.M)


def test_a_daemon_that_dies_before_it_is_online_fails_the_demo_at_once(capsys):
    # On armv7 the daemon died at start-up (a 32-bit bincount cast): the demo said "online"
    # and then waited out every route's answer timeout before failing.
    class Client:
        def wait_for(self, predicate, timeout_s):
            return predicate()

        status = None

        def send(self, *_):
            raise AssertionError("nothing is sent to a dead daemon")

    daemon = SimpleNamespace(poll=lambda: 1, returncode=1, pid=4242)
    run = RouteRun(SimpleNamespace(name="r"), np.zeros((3, 2)), np.zeros(3), ["a"])
    assert replay(Client(), daemon, {"r": run}, None) is False
    assert capsys.readouterr().out == "daemon: exited with code 1 before it came online\n"
