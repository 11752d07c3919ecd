"""The daemon end to end over a real mosquitto, with the bundled INT8 models."""

from __future__ import annotations

import io
import json
import signal
import time

import numpy as np
import pytest

from daemon.config.loader import load_config
from daemon.pipeline.evaluate import validate
from tests.integration import brokers
from tests.integration.conftest import LARGE_MODELS, LARGE_ROUTE, ROOT, WAIT_S, Client, Daemon, burst, write_config

# What a held link may have read past the byte budget at most (see the hold test).
HELD_READ_BYTES = 1 << 20
# Requests a test client keeps outstanding (see daemon/tools/demo.py WINDOW for why clients pace).
WINDOW = 16


def _samples(model: str):
    with np.load(ROOT / "models" / model / "test.npz") as data:
        return data["x"], data["y"]


def _labels(model: str) -> list[str]:
    return (ROOT / "models" / model / "labels.txt").read_text().split()


def replay(client: Client, topic: str, reply_topic: str, payloads: list[bytes], raw: bool) -> dict[int, dict]:
    """Send every payload (JSON id, or CorrelationData for raw) with a bounded window."""
    client.subscribe(reply_topic)
    base = len(client.on(reply_topic))
    for i, payload in enumerate(payloads):
        if i >= WINDOW:
            client.wait_count(reply_topic, base + i - WINDOW + 1)
        client.publish(topic, payload, correlation=str(i).encode() if raw else None)
    msgs = client.wait_count(reply_topic, base + len(payloads))[base:]
    out = {}
    for m in msgs:
        reply = json.loads(m.payload)
        key = int(m.properties.CorrelationData.decode()) if raw else reply["id"]
        out[key] = reply
    return out


@pytest.fixture(scope="module")
def bundled_node(tmp_path_factory):
    """(config, client): one daemon with the bundled config (cache off) for the four test-set runs
    below. They only send requests and read their replies (each from its own count on), so none
    needs a daemon of its own."""
    tmp = tmp_path_factory.mktemp("bundled")
    with brokers.KINDS[brokers.MOSQUITTO].make(tmp / "broker") as broker:
        config = write_config(tmp, cache={"enabled": False})
        client = Client(broker)
        daemon = Daemon(config, broker.address, tmp / "daemon.log")
        try:
            client.subscribe("edge-inferd/edge-inferd/status")
            client.wait_payload("edge-inferd/edge-inferd/status", b"online")
            yield config, client
        finally:
            client.close()
            daemon.stop()


@pytest.mark.parametrize("route,model,fmt", [("activity", "activity", "json"), ("activity-raw", "activity", "raw"),
                                              ("appliance", "appliance", "json"),
                                              ("appliance-raw", "appliance", "raw")])
def test_bundled_test_set_over_mqtt_matches_validate(bundled_node, route, model, fmt):
    config, client = bundled_node
    expected = validate(load_config(config), route, ROOT / "models" / model / "test.npz")[0]["accuracy"]
    x, y = _samples(model)
    if fmt == "raw":
        payloads = [s.astype("<f4").tobytes() for s in x]
    else:
        payloads = [json.dumps({"id": i, "data": s.tolist()}).encode() for i, s in enumerate(x)]
    topic = {"activity": "sensors/w1/imu", "activity-raw": "sensors/w1/imu/raw", "appliance": "plugs/p1/power",
             "appliance-raw": "plugs/p1/power/raw"}[route]
    reply_topic = {"activity": "results/w1/activity", "appliance": "results/p1/appliance"}[model]

    replies = replay(client, topic, reply_topic, payloads, raw=fmt == "raw")

    assert sorted(replies) == list(range(len(x)))
    labels = _labels(model)
    assert all(r["route"] == route and "error" not in r for r in replies.values())
    accuracy = np.mean([replies[i]["label"] == labels[y[i]] for i in range(len(x))])
    assert accuracy == pytest.approx(expected)
    first = replies[0]
    assert set(first) >= {"id", "route", "model", "model_sha256", "label", "index", "score", "top_k", "cached",
                          "latency_ms"}
    assert len(first["model_sha256"]) == 12 and len(first["top_k"]) == 3
    assert first["label"] == first["top_k"][0]["label"] == labels[first["index"]]


def _activity_payload(i: int = 0, **extra) -> bytes:
    x, _ = _samples("activity")
    return json.dumps({"id": i, "data": x[i].tolist(), **extra}).encode()


@pytest.mark.brokers()
def test_response_topic_gets_the_reply_with_correlation_data(tmp_path, client, start_daemon):
    start_daemon(write_config(tmp_path), wait_online=client)  # MQTT v5 only: the default transport
    client.subscribe("clients/me/replies")
    client.subscribe("results/w9/activity")

    client.publish("sensors/w9/imu", _activity_payload(3), response_topic="clients/me/replies", correlation=b"req-42")

    [msg] = client.wait_count("clients/me/replies", 1)
    assert msg.properties.CorrelationData == b"req-42"
    assert json.loads(msg.payload)["id"] == 3
    assert client.on("results/w9/activity") == []  # answered on the ResponseTopic instead


def test_topic_captures_fill_the_publish_template(tmp_path, client, start_daemon):
    raw = load_config(ROOT / "config.yaml")
    assert raw.routes[0].name == "activity"
    config = write_config(tmp_path)
    text = config.read_text().replace("subscribe: sensors/+/imu\n", "subscribe: site/+/sensors/+/imu\n", 1)
    text = text.replace("publish: results/{1}/activity\n", "publish: out/{2}/{1}/{topic}\n", 1)
    config.write_text(text)
    start_daemon(config, wait_online=client)
    client.subscribe("out/#")

    client.publish("site/berlin/sensors/w7/imu", _activity_payload(0))

    [reply] = client.wait_json("out/w7/berlin/site/berlin/sensors/w7/imu")
    assert reply["route"] == "activity" and reply["id"] == 0


def _appliance_payload(i: int = 0) -> bytes:
    x, _ = _samples("appliance")
    return json.dumps({"id": i, "data": x[i].tolist()}).encode()


def test_repeated_input_is_a_cache_hit_and_survives_a_restart(tmp_path, broker, client, start_daemon):
    """appliance_large (~7.5 ms a trace) costs far more than a disk read, so its results go to the
    disk tier too (a cheap model's stay in memory: a cold restart, tests/cache/test_admission.py).
    The bundled appliance model (~40 µs a sample) was within the noise of a disk read, and its
    disk write came or not with the minute (1 failure in a fresh-clone run). Admission: the first
    sighting is remembered, the second stored, the third a hit."""
    config = write_config(tmp_path, stats_interval_s=0.1, models=LARGE_MODELS, routes=[LARGE_ROUTE])
    first = start_daemon(config, wait_online=client)
    client.subscribe("results/c1/appliance")
    client.subscribe("edge-inferd/edge-inferd/stats")
    # In sequence, each after the cache has taken the one before: a result is offered to the cache
    # right after its reply is sent, so the reply alone does not say the cache has seen it.
    for n, taken in ((1, lambda c: c["refused"] >= 1), (2, lambda c: c["entries"] >= 1 and c["writes"] >= 1)):
        client.publish("plugs/c1/power", _appliance_payload(5))
        client.wait_count("results/c1/appliance", n)
        client.wait_json_until("edge-inferd/edge-inferd/stats", lambda s: taken(s["cache"]))
    client.publish("plugs/c1/power", _appliance_payload(5))
    a, b, c = client.wait_json("results/c1/appliance", 3)
    assert (a["cached"], b["cached"], c["cached"]) == (False, False, True)
    assert a["label"] == c["label"] and a["top_k"] == c["top_k"]
    assert first.stop() == 0

    fresh = Client(broker)
    start_daemon(config, wait_online=fresh)
    fresh.subscribe("results/c1/appliance")
    fresh.publish("plugs/c1/power", _appliance_payload(5))
    [d] = fresh.wait_json("results/c1/appliance", 1)
    fresh.close()
    assert d["cached"] is True and d["label"] == a["label"]


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def test_each_bad_request_gets_its_error_code_and_the_daemon_keeps_serving(tmp_path, client, start_daemon):
    config = write_config(tmp_path)
    start_daemon(config, wait_online=client)
    client.subscribe("results/e1/activity")
    bad = [
        (b"{not json", "bad_payload"),
        (json.dumps({"id": "s", "data": [1.0, 2.0]}).encode(), "bad_shape"),
        (json.dumps({"id": "n", "data": [[float("nan")] * 6] * 100}).encode(), "bad_payload"),
        (b" " * (1024 * 1024 + 1), "too_large"),
        (_activity_payload(1, timeout_ms=0), "expired"),
    ]
    for payload, _ in bad:
        client.publish("sensors/e1/imu", payload)
    client.publish("sensors/e1/imu", _activity_payload(2))

    replies = client.wait_json("results/e1/activity", len(bad) + 1)  # two workers: any order
    codes = sorted(str(r.get("error", {}).get("code")) for r in replies)
    assert codes == sorted([code for _, code in bad] + ["None"])
    by_id = {json.dumps(r["id"]): r for r in replies if r["id"] is not None}
    assert by_id['"s"']["error"]["code"] == "bad_shape" and by_id['"n"']["error"]["code"] == "bad_payload"
    assert by_id["1"]["error"]["code"] == "expired"
    assert "label" in by_id["2"]
    assert all(r["route"] == "activity" for r in replies)
    assert all(r["error"]["message"] for r in replies if "error" in r)


def test_past_the_byte_budget_requests_are_answered_overloaded_never_dropped(tmp_path, client, start_daemon,
                                                                            transport):
    # queue_mb 0.01 (~10 KiB) cannot hold one appliance JSON request (~28 KiB): each is shed.
    config = write_config(tmp_path, transport=transport, workers={"max": 1, "queue_mb": 0.01}, cache={"enabled": False})
    start_daemon(config, wait_online=client)
    client.subscribe("results/o1/appliance")
    client.subscribe("results/o1/activity")
    x, _ = _samples("appliance")
    n = 200
    for i in range(n):  # QoS 0: no broker flow control, as a careless publisher would send
        client.publish("plugs/o1/power", json.dumps({"id": i, "data": x[i % len(x)].tolist()}).encode(), qos=0)
    replies = client.wait_json("results/o1/appliance", n)
    assert sorted(r["id"] for r in replies) == list(range(n))  # every request answered exactly once
    assert {r["error"]["code"] for r in replies} == {"overloaded"}
    assert "workers.queue_mb" in replies[0]["error"]["message"]
    small, _ = _samples("activity")
    client.publish("sensors/o1/imu/raw", small[0].astype("<f4").tobytes())  # 2,400 bytes: fits, and is served
    [served] = client.wait_json("results/o1/activity")
    assert "label" in served


def test_reading_stops_when_the_byte_budget_fills_and_every_qos1_request_gets_a_result(
        tmp_path, client, start_daemon, transport):
    # queue_mb 0.1 (~100 KiB) holds 3 appliance JSON requests (~28 KiB each) of a 200-request QoS 1 burst:
    # QoS 0 ones past it are answered `overloaded` (the test above); QoS 1 ones wait at the broker. The
    # route serves appliance_large (~7.5 ms a trace): read without a hold, the burst would queue whole.
    config = write_config(tmp_path, transport=transport, workers={"max": 1, "queue_mb": 0.1},
                          cache={"enabled": False}, stats_interval_s=0.2, models=LARGE_MODELS, routes=[LARGE_ROUTE])
    start_daemon(config, wait_online=client)
    client.subscribe("results/h1/appliance")
    client.subscribe("edge-inferd/edge-inferd/stats")
    x, _ = _samples("appliance")
    n = 200
    # All at once (a burst, as a gateway replaying its buffer sends it): published one by one, each
    # after the last one's PUBACK, an idle machine served each before the next came, and nothing held.
    burst(client, "plugs/h1/power", [json.dumps({"id": i, "data": x[i % len(x)].tolist()}).encode()
                                     for i in range(n)])
    replies = client.wait_json("results/h1/appliance", n)
    assert sorted(r["id"] for r in replies) == list(range(n))
    assert [r for r in replies if "error" in r] == []  # every one a result, none shed
    stats = client.wait_json_until("edge-inferd/edge-inferd/stats", lambda s: s["results"] >= n)
    assert stats["queue"]["holds"] >= 1 and stats["errors"] == {}
    # Held, not queued: past the budget by at most what one read had taken in (native: a read burst of
    # 256 KiB and the request it cut; paho on 3.1.1: mosquitto's 20 messages in flight to a client,
    # ~560 KiB), against 200 x ~28 KiB = 5.6 MB had the burst been read whole.
    assert stats["queue"]["peak_bytes"] <= 0.1 * 2**20 + HELD_READ_BYTES, stats["queue"]


def test_an_idle_daemon_stopped_by_sigterm_exits_0_and_leaves_a_retained_offline(tmp_path, broker, client,
                                                                                 start_daemon, transport):
    daemon = start_daemon(write_config(tmp_path, transport=transport), wait_online=client)
    assert daemon.stop(signal.SIGTERM) == 0, daemon.log()

    late = Client(broker)  # a new subscriber sees the retained status
    late.subscribe("edge-inferd/edge-inferd/status")
    [msg] = late.wait_count("edge-inferd/edge-inferd/status", 1)
    late.close()
    assert msg.payload == b"offline" and msg.retain
    assert "Traceback" not in daemon.log()


def test_a_sighup_with_nothing_changed_applies_nothing_and_keeps_serving(tmp_path, client, start_daemon):
    daemon = start_daemon(write_config(tmp_path), wait_online=client)
    daemon.proc.send_signal(signal.SIGHUP)
    assert daemon.wait_for_log("reload: nothing to apply")
    client.subscribe("results/h1/activity")
    client.publish("sensors/h1/imu", _activity_payload(0))
    [reply] = client.wait_json("results/h1/activity")
    assert reply["id"] == 0 and daemon.proc.poll() is None
    assert daemon.stop() == 0
    assert "reload failed" not in daemon.log()


@pytest.mark.brokers("v311")
def test_mqtt_3_1_1_is_selectable(tmp_path, broker, start_daemon):
    import paho.mqtt.client as paho

    client = Client(broker, protocol=paho.MQTTv311)
    try:
        start_daemon(write_config(tmp_path, mqtt={"protocol": "3.1.1"}), wait_online=client)
        client.subscribe("results/v3/activity")
        client.publish("sensors/v3/imu", _activity_payload(4))
        [reply] = client.wait_json("results/v3/activity")
        assert reply["id"] == 4 and "label" in reply
    finally:
        client.close()


def test_retained_stats_describe_the_node_and_follow_its_traffic(tmp_path, client, start_daemon):
    start_daemon(write_config(tmp_path, stats_interval_s=0.2), wait_online=client)
    client.subscribe("edge-inferd/edge-inferd/stats")
    first = client.wait_json("edge-inferd/edge-inferd/stats")[0]
    for key in ("received", "results", "errors", "cache", "queue", "workers", "models", "latency_ms",
                "reconnects", "outbox", "uptime_s"):
        assert key in first, key
    assert first["models"]["activity"]["loaded"] is True and len(first["models"]["activity"]["sha256"]) == 12
    client.subscribe("results/s1/activity")
    client.publish("sensors/s1/imu", _activity_payload(0))
    client.publish("sensors/s1/imu", b"{broken")
    client.wait_json("results/s1/activity", 2)
    client.wait_json_until("edge-inferd/edge-inferd/stats",
                           lambda s: s["results"] >= 1 and s["errors"].get("bad_payload", 0) >= 1)


def test_prometheus_endpoint_counts_requests_by_route_and_outcome(tmp_path, client, start_daemon):
    import urllib.request

    from daemon.tools.broker import free_port

    port = free_port()
    start_daemon(write_config(tmp_path, metrics={"port": port}), wait_online=client)
    client.subscribe("results/p1/activity")
    client.publish("sensors/p1/imu", _activity_payload(0))
    client.publish("sensors/p1/imu", b"{broken")
    client.wait_json("results/p1/activity", 2)
    text = ""
    for _ in range(int(WAIT_S / 0.1)):  # the counters land just after the replies are published
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=WAIT_S).read().decode()
        if 'outcome="bad_payload"' in text and 'outcome="result"' in text:
            break
        time.sleep(0.1)
    assert 'edge_inferd_requests_total{outcome="result",route="activity"} 1.0' in text
    assert 'edge_inferd_requests_total{outcome="bad_payload",route="activity"} 1.0' in text
    assert "edge_inferd_request_duration_seconds_count 1.0" in text
    assert 'edge_inferd_stage_seconds_bucket{le="+Inf",stage="queue"}' in text
    assert "edge_inferd_queue_depth 0.0" in text
    assert 'edge_inferd_model_loaded{model="activity"} 1.0' in text


def test_status_command_prints_the_node_as_a_table(tmp_path, broker, client, start_daemon):
    import subprocess
    import sys

    from daemon.tools.broker import end_process

    start_daemon(write_config(tmp_path), wait_online=client)
    client.subscribe("edge-inferd/edge-inferd/stats")
    client.wait_count("edge-inferd/edge-inferd/stats", 1)
    # Both at once: the one for a node that is not there waits out status's whole fetch timeout.
    procs = [subprocess.Popen([sys.executable, "-m", "daemon", "status", "--broker", broker.address, "--client-id",
                               node], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
             for node in ("edge-inferd", "nobody")]
    try:
        out, missing = (subprocess.CompletedProcess(p.args, 0, *p.communicate(timeout=WAIT_S)) for p in procs)
    finally:
        for p in procs:
            end_process(p, signal.SIGKILL)  # gone already, unless a communicate timed out
    out.returncode, missing.returncode = (p.returncode for p in procs)
    assert out.returncode == 0, out.stderr
    assert "node edge-inferd: online" in out.stdout and "received 0" in out.stdout
    assert "activity" in out.stdout and "predicted wait" in out.stdout
    assert missing.returncode == 1 and "no edge-inferd node nobody" in missing.stderr


def test_status_watch_redraws_the_table_as_the_stats_come_and_stops_on_ctrl_c(tmp_path, broker, client,
                                                                               start_daemon):
    import subprocess
    import sys

    from tests.integration.conftest import activity_payloads

    start_daemon(write_config(tmp_path, stats_interval_s=0.2), wait_online=client)
    watch = subprocess.Popen([sys.executable, "-m", "daemon", "status", "--watch", "0.2", "--broker", broker.address,
                              "--client-id", "edge-inferd"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, cwd=ROOT)
    seen: list[str] = []
    deadline = time.monotonic() + WAIT_S

    def read_until(done) -> None:  # a table per 0.2 s: each wait is bounded by them
        while time.monotonic() < deadline and not any(done(line) for line in seen):
            seen.append(watch.stdout.readline().rstrip("\n"))

    read_until(lambda line: line.startswith("edge-inferd status --watch:"))  # its first table, before any request
    client.subscribe("results/+/activity")
    burst(client, "sensors/w1/imu", activity_payloads(20))
    client.wait_count("results/w1/activity", 20)
    read_until(lambda line: "results 20" in line)
    watch.send_signal(signal.SIGINT)
    rest, errors = watch.communicate(timeout=WAIT_S)
    lines = seen + rest.splitlines()
    assert watch.returncode == 0, errors
    assert any("results 20" in line for line in lines), "\n".join(lines[-20:])  # the live stats, not one read
    assert sum(line.startswith("edge-inferd status --watch:") for line in lines) >= 2  # redrawn
    assert any(line.startswith("node edge-inferd  online") for line in lines)
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)


@pytest.mark.brokers()
def test_two_daemons_with_one_client_id_are_told_so(tmp_path, broker, start_daemon, transport):
    """The broker drops the older of two clients with one id. mosquitto and rumqttd give no reason:
    each daemon's connections keep dropping right after connecting, and the log guesses why. A
    broker that sends v5 DISCONNECT 0x8E (ejabberd) is named: "session taken over"."""
    config = write_config(tmp_path, transport=transport, cache={"enabled": False})
    first, second = start_daemon(config), start_daemon(config)
    clash = ("session taken over: another client connected" if brokers.has(broker, "takeover_reason")
             else "another client is probably using client_id 'edge-inferd'")
    for _ in range(int(WAIT_S / 0.1)):
        if clash in first.log() or clash in second.log():
            break
        time.sleep(0.1)  # polling two log files; the limit only bounds a failing test
    assert clash in first.log() or clash in second.log(), first.log()[-2000:] + second.log()[-2000:]
