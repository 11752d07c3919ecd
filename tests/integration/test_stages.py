"""openWakeWord's chain as one route's `stages` in the daemon over a real mosquitto: a burst of
clips from three devices, batched; each reply's windows against the models invoked directly, the
earlier stages published, and the per-stage timings (`latency_ms.stages`) and window counts in the stats."""

from __future__ import annotations

import hashlib
import signal
from pathlib import Path

import numpy as np
import yaml

from tests.integration.conftest import burst, write_config
from tests.model.test_stages_chain import SCORE_TOLERANCE, chain_config, direct_scores

DEVICES = 3


def _clip(seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(48_000) * 1500).astype(np.float32)


def test_a_chain_route_answers_each_device_per_window_with_its_stages_published(tmp_path, client, start_daemon):
    (tmp_path / "base").mkdir()
    base = chain_config(tmp_path / "base", publish_stages=True)
    workers = {"max": 1, "min": 1}  # one worker: what queues behind a clip is batched
    daemon = start_daemon(write_config(tmp_path, base=base, workers=workers), wait_online=client)
    client.subscribe("wake/+")
    clips = {f"d{i}": _clip(i) for i in range(DEVICES)}
    for device, clip in clips.items():
        burst(client, f"audio/{device}/clip", [clip.astype("<f4").tobytes()])
    got = {device: client.wait_json(f"wake/{device}")[0] for device in clips}
    for device, clip in clips.items():
        reply = got[device]
        _, embeddings, scores = direct_scores(clip)
        np.testing.assert_allclose([w["score"] for w in reply["windows"]], scores, atol=SCORE_TOLERANCE)
        assert reply["label"] == "hey_jarvis" and reply["model"] == "mel" and not reply["cached"]
        mel, embedded = reply["stages"]
        assert mel["left_out"] == {"values": [297, 32]} and embedded["shape"] == [28, 96]
        np.testing.assert_allclose(embedded["values"], embeddings, atol=1e-3, rtol=1e-4)
    daemon.stop()
    stats = daemon.final_stats()
    assert stats["counts"]["stage_windows.embedding"] == 28 * DEVICES
    assert stats["counts"]["stage_windows.jarvis"] == 13 * DEVICES
    assert {"stage0:mel", "stage1:embedding", "stage2:jarvis"} <= set(stats["latency_ms"]["stages"])
    drift = stats["drift"]  # the answer's own, and each earlier stage's (its mean output a request)
    assert {"wake", "wake/stage0:mel", "wake/stage1:embedding"} <= set(drift), drift
    assert drift["wake/stage1:embedding"]["kind"] == "anomaly", drift


def _rebuilt(model_bytes: bytes, description: bytes) -> bytes:
    """The same graph and weights with another description: another sha256, the same answers."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromObj(schema.Model.GetRootAsModel(model_bytes, 0))
    model.description = description
    builder = flatbuffers.Builder(len(model_bytes) + 1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def test_a_stage_model_is_swapped_on_reload_as_any_model_is(tmp_path, client, start_daemon):
    """SIGHUP after a stage's model file changed: the chain serves on with the new release of that
    stage (the stats name its digest), and answers as before (the same graph)."""
    (tmp_path / "base").mkdir()
    base = chain_config(tmp_path / "base")
    raw = yaml.safe_load(base.read_text())
    jarvis = tmp_path / "jarvis.tflite"
    jarvis.write_bytes(Path(raw["models"]["jarvis"]["path"]).read_bytes())
    raw["models"]["jarvis"]["path"] = str(jarvis)
    base.write_text(yaml.safe_dump(raw, sort_keys=False))
    daemon = start_daemon(write_config(tmp_path, base=base), wait_online=client)
    client.subscribe("wake/d")
    clip = _clip(7).astype("<f4").tobytes()
    burst(client, "audio/d/clip", [clip])
    before = client.wait_json("wake/d")[0]
    jarvis.write_bytes(_rebuilt(jarvis.read_bytes(), b"hey_jarvis, rebuilt"))
    daemon.proc.send_signal(signal.SIGHUP)
    assert daemon.wait_for_log("reload: applied (models swapped: jarvis)"), daemon.log()[-3000:]
    burst(client, "audio/d/clip", [clip])
    after = client.wait_json("wake/d", 2)[1]
    assert [w["score"] for w in after["windows"]] == [w["score"] for w in before["windows"]]
    daemon.stop()
    assert daemon.final_stats()["models"]["jarvis"]["sha256"] == hashlib.sha256(jarvis.read_bytes()).hexdigest()[:12]
