"""Streams over a real mosquitto (daemon/serve/streams.py, daemon/pipeline/stream_window.py): the
bundled activity model, its test split laid end to end as each device's signal, one sample a
message. A stream's windows answer exactly as the same windows sent whole; gaps, redeliveries,
interleaved devices, a flood past `max_streams` and a SIGKILL mid-stream."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.integration.conftest import ROOT, burst, write_config

pytestmark = pytest.mark.integration

WINDOW, HOP = 100, 50
STREAM_TOPIC, WHOLE_TOPIC = "sensors/{}/imu/stream", "sensors/{}/imu"


def signal_of(device: int, windows: int = 4) -> np.ndarray:
    """A device's signal: test windows laid end to end (different per device), rounded as JSON sends them."""
    with np.load(ROOT / "models/activity/test.npz") as data:
        x = data["x"]
    return np.round(np.concatenate([x[(device * 3 + i) % len(x)] for i in range(windows)]), 3)


def stream_config(tmp_path, **stream) -> Path:
    """config.yaml with a stream route beside its activity route: the same model and steps."""
    path = write_config(tmp_path)
    raw = yaml.safe_load(path.read_text())
    whole = next(r for r in raw["routes"] if r["name"] == "activity")
    route = {**whole, "name": "activity-stream", "subscribe": "sensors/+/imu/stream",
             "publish": "results/{1}/activity-stream",
             "input": {**whole["input"], "stream": {"seq": "seq", "hop": HOP, **stream}}}
    route.pop("validate", None)
    raw["routes"] = [whole, route]
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def sample_messages(signal_rows: np.ndarray, first_seq: int = 0) -> list[bytes]:
    return [json.dumps({"id": f"s{first_seq + i}", "seq": first_seq + i, "data": row.tolist()}).encode()
            for i, row in enumerate(signal_rows)]


def whole_answers(client, device: str, rows: np.ndarray, windows: list[dict]) -> dict:
    """The same windows sent whole to the activity route: {first_seq: reply}."""
    topic = f"results/{device}/activity"
    client.subscribe(topic)
    payloads = [json.dumps({"id": w["first_seq"], "data": rows[w["first_seq"]:w["last_seq"] + 1].tolist()}).encode()
                for w in windows]
    burst(client, WHOLE_TOPIC.format(device), payloads)
    return {r["id"]: r for r in client.wait_json(topic, len(payloads))}


def same_answer(streamed: dict, whole: dict) -> bool:
    return (streamed["label"], streamed["score"], streamed["top_k"]) == (whole["label"], whole["score"], whole["top_k"])


def test_interleaved_devices_one_sample_a_message_answer_as_their_windows_sent_whole(tmp_path, client, start_daemon):
    start_daemon(stream_config(tmp_path), wait_online=client)
    devices = {f"d{i}": signal_of(i) for i in range(3)}
    for device in devices:
        client.subscribe(f"results/{device}/activity-stream")
    messages = {device: sample_messages(rows) for device, rows in devices.items()}
    for i in range(len(devices["d0"])):  # the devices' samples interleaved, as they arrive at a broker
        for device in devices:
            client.c.publish(STREAM_TOPIC.format(device), messages[device][i], qos=1)
    expected = (len(devices["d0"]) - WINDOW) // HOP + 1
    for device, rows in devices.items():
        windows = client.wait_json(f"results/{device}/activity-stream", expected)
        assert [(w["first_seq"], w["last_seq"]) for w in windows] == [(s, s + WINDOW - 1)
                                                                      for s in range(0, len(rows) - WINDOW + 1, HOP)]
        assert all(w["stream"] == device and w["route"] == "activity-stream" for w in windows)
        assert [w["gap"] for w in windows] == [True] + [False] * (expected - 1)  # the first: a new stream
        assert windows[0]["gap_reason"] == "new" and windows[-1]["id"] == f"s{len(rows) - 1}"
        whole = whole_answers(client, device, rows, windows)
        assert all(same_answer(w, whole[w["first_seq"]]) for w in windows), (windows[0], whole[0])


def test_redeliveries_are_dropped_a_lost_sample_restarts_the_window_and_bad_samples_are_answered(
        tmp_path, client, start_daemon):
    daemon = start_daemon(stream_config(tmp_path), wait_online=client)
    client.subscribe("results/g/activity-stream")
    rows = signal_of(5, windows=3)
    messages = sample_messages(rows)
    redelivered = messages[:120] + messages[100:110]  # ten QoS 1 redeliveries
    lost = messages[130:]  # 120..129 never arrive
    bad = [b'{"id": "bad", "seq": 131, "data": [1, 2, 3]}', b'not json']
    burst(client, STREAM_TOPIC.format("g"), redelivered + bad[:1] + lost + bad[1:])
    replies = client.wait_json("results/g/activity-stream", 5)
    errors = [r for r in replies if "error" in r]
    windows = [r for r in replies if "error" not in r]
    assert [(e["id"], e["error"]["code"]) for e in errors] == [("bad", "bad_shape"), (None, "bad_payload")]
    assert "whole samples of [6]" in errors[0]["error"]["message"]
    assert [(w["first_seq"], w["last_seq"]) for w in windows] == [(0, 99), (130, 229), (180, 279)]
    assert (windows[1]["gap"], windows[1]["gap_reason"], windows[1]["missed"]) == (True, "seq", 10)
    daemon.stop()
    counts = daemon.final_stats()["counts"]
    assert (counts["stream_duplicates"], counts["stream_gaps"], counts["stream_windows"]) == (10, 1, 3), counts


def test_a_flood_of_streams_past_max_streams_evicts_and_counts_and_the_rest_keep_serving(
        tmp_path, client, start_daemon):
    daemon = start_daemon(stream_config(tmp_path, max_streams=4), wait_online=client)
    rows = signal_of(2, windows=1)[:WINDOW]
    client.subscribe("results/+/activity-stream")
    flood = [(STREAM_TOPIC.format(f"f{i}"), m) for i in range(40) for m in sample_messages(rows[:10])]
    for topic, message in flood:  # 40 devices' first 10 samples: only 4 streams are held at a time
        client.c.publish(topic, message, qos=1)
    burst(client, STREAM_TOPIC.format("kept"), sample_messages(rows))  # a device that sends a whole window
    reply = client.wait_json("results/kept/activity-stream", 1)[0]
    assert (reply["stream"], reply["first_seq"], reply["last_seq"]) == ("kept", 0, WINDOW - 1)
    daemon.stop()
    final = daemon.final_stats()
    assert final["counts"]["stream_evicted"] >= 36, final["counts"]
    assert final["streams"]["activity-stream"]["streams"] == 4
    assert final["streams"]["activity-stream"]["bytes"] == 4 * WINDOW * (6 * 4 + 8 + 8)


def test_a_daemon_killed_mid_stream_answers_every_later_window_and_says_the_stream_started_again(
        tmp_path, client, start_daemon):
    config = stream_config(tmp_path)
    daemon = start_daemon(config, wait_online=client)
    client.subscribe("results/k/activity-stream")
    rows = signal_of(7, windows=4)
    messages = sample_messages(rows)
    burst(client, STREAM_TOPIC.format("k"), messages[:170])  # windows 0-99 and 50-149; 150-169 partial
    assert [w["first_seq"] for w in client.wait_json("results/k/activity-stream", 2)] == [0, 50]
    daemon.stop(signal.SIGKILL)
    client.messages.clear()
    start_daemon(config, wait_online=client)
    burst(client, STREAM_TOPIC.format("k"), messages[170:])
    windows = client.wait_json("results/k/activity-stream", 3)
    # The new stream starts at the first sample the broker gave the new daemon: 170, or as early as
    # 149 when the kill came before the acks of 149 (its window's reply was out) and those after it
    # had left, and the broker redelivered them. From there on, every window.
    start = windows[0]["first_seq"]
    assert 149 <= start <= 170, windows[0]
    assert [(w["first_seq"], w["last_seq"]) for w in windows] == [(s, s + WINDOW - 1) for s in range(start, start + 3 * HOP, HOP)]
    assert (windows[0]["gap"], windows[0]["gap_reason"]) == (True, "new")
    assert not windows[1]["gap"] and not windows[2]["gap"]


def test_a_sample_that_overtakes_another_restarts_the_window_and_the_late_one_is_dropped(
        tmp_path, client, start_daemon):
    """Two messages swapped on their way (two publishers, a reconnect): a window never holds
    samples out of order. 161 before 160: the window starts again at 161 (one sample missed), and
    160, late, is dropped."""
    daemon = start_daemon(stream_config(tmp_path), wait_online=client)
    client.subscribe("results/o/activity-stream")
    messages = sample_messages(signal_of(9, windows=3))
    messages[160], messages[161] = messages[161], messages[160]
    burst(client, STREAM_TOPIC.format("o"), messages)
    windows = client.wait_json("results/o/activity-stream", 3)
    assert [(w["first_seq"], w["last_seq"], w["gap"]) for w in windows] == [(0, 99, True), (50, 149, False),
                                                                             (161, 260, True)]
    assert (windows[2]["gap_reason"], windows[2]["missed"]) == ("seq", 1)
    daemon.stop()
    counts = daemon.final_stats()["counts"]
    assert (counts["stream_duplicates"], counts["stream_gaps"]) == (1, 1), counts


def test_over_http_a_stream_route_takes_a_whole_window_as_one_request(tmp_path, client, start_daemon):
    """An HTTP caller waits for an answer to each body: on a stream route a body is a whole window,
    answered as the MQTT route answers it (no stream kept)."""
    from tests.integration.test_http import _call, _wait_http
    from daemon.tools.broker import free_port

    port = free_port()
    config = stream_config(tmp_path)
    raw = yaml.safe_load(config.read_text())
    raw["http"] = {"port": port}
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    daemon = start_daemon(config, wait_online=client)
    _wait_http(port, daemon)
    rows = signal_of(4, windows=1)
    body = json.dumps({"id": "w", "data": rows.tolist()}).encode()
    status, _, payload = _call(port, "POST", "/routes/activity-stream", body, {"Content-Type": "application/json"})
    assert status == 200, payload
    reply = json.loads(payload)
    whole = whole_answers(client, "h", rows, [{"first_seq": 0, "last_seq": WINDOW - 1}])[0]
    assert reply["id"] == "w" and "stream" not in reply and same_answer(reply, whole)
