"""The HTTP listener against the real Service (in this process) and a real mosquitto: every endpoint,
every status code, the byte-for-byte route path, and a slow client that blocks nobody else.

The Service is started once per module (the bundled models, a private cache), its listener on a
free port; requests go over real sockets with http.client (keep-alive) or raw sockets.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon.config.loader import load_config
from daemon.config.reader import absolute_paths
from daemon.lifecycle.service import Service
from daemon.tools.broker import Broker, free_port

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "t0ken-for-the-http-tests-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TIMEOUT_MS = 1500


def _activity_rows(n: int) -> np.ndarray:
    with np.load(ROOT / "models/activity/test.npz") as data:
        return np.round(data["x"][:n].astype(np.float32), 3)


def write_http_config(tmp: Path, **http) -> Path:
    raw = absolute_paths(yaml.safe_load((ROOT / "config.yaml").read_text()), ROOT)
    raw["cache"] = {**raw["cache"], "dir": str(tmp / "cache")}
    raw["mqtt"] = {**raw["mqtt"], "client_id": "edge-inferd-http-test", "outbox": {"max_mb": 0}}
    raw["workers"] = {"max": 1}
    (tmp / "token").write_text(TOKEN + "\n")
    # a route that sheds: one request per device every 10 s
    limited = dict(next(r for r in raw["routes"] if r["name"] == "activity"), name="activity-limited",
                   subscribe="limited/+/imu", min_interval_ms=10_000)
    limited.pop("validate", None)
    raw["routes"].append(limited)
    raw["http"] = {"port": free_port(), "token_file": str(tmp / "token"), "request_timeout_ms": TIMEOUT_MS,
                   "max_body_bytes": 200_000, "max_connections": 8, **http}
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("http")
    with Broker(tmp / "broker") as broker:
        config = load_config(write_http_config(tmp)).with_broker(broker.address)
        service = Service(config)
        service.startup()
        try:
            assert service.link.online.wait(30)
            yield service, broker
        finally:
            service.shutdown()


def request(service, method: str, path: str, body: object = None, headers: dict = AUTH,
            conn: http.client.HTTPConnection = None) -> tuple[int, dict, bytes]:
    own = conn is None
    conn = conn or http.client.HTTPConnection("127.0.0.1", service.http_port, timeout=30)
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    conn.request(method, path, body=data, headers={**headers, **({"Content-Type": "application/json"}
                                                                 if data is not None else {})})
    response = conn.getresponse()
    payload = response.read()
    if own:
        conn.close()
    return response.status, dict(response.getheaders()), payload


def v2_body(rows: np.ndarray, request_id: str = "r1", datatype: str = "FP32") -> dict:
    return {"id": request_id, "inputs": [{"name": "input", "shape": list(rows.shape), "datatype": datatype,
                                          "data": rows.ravel().tolist()}]}


def test_health_server_and_model_metadata(daemon):
    service, _ = daemon
    assert request(service, "GET", "/v2/health/live", headers={})[:1] == (200,)
    status, _, body = request(service, "GET", "/v2/health/ready", headers={})
    assert (status, json.loads(body)) == (200, {"ready": True})
    status, _, body = request(service, "GET", "/v2")
    assert status == 200 and json.loads(body)["name"] == "edge-inferd"
    status, _, body = request(service, "GET", "/v2/models/activity")
    meta = json.loads(body)
    version = service.models["activity"].sha256[:12]
    assert status == 200 and meta["versions"] == [version]
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 100, 6]}]
    assert [o["name"] for o in meta["outputs"]] == ["label", "index", "scores", "labels"]
    raw_meta = json.loads(request(service, "GET", "/v2/models/activity-raw")[2])
    assert raw_meta["inputs"][0]["datatype"] == "FP32"
    assert request(service, "GET", "/v2/models/activity/ready")[:1] == (200,)
    assert request(service, "GET", f"/v2/models/activity/versions/{version}/ready")[:1] == (200,)
    assert request(service, "GET", "/v2/models/activity/versions/000000000000/ready")[0] == 404


def test_v2_infer_answers_like_the_mqtt_route_and_a_batch_is_n_requests(daemon):
    service, _ = daemon
    rows = _activity_rows(3)
    status, _, body = request(service, "POST", "/v2/models/activity/infer", v2_body(rows[:1]))
    one = json.loads(body)
    assert status == 200, body
    assert one["id"] == "r1" and one["model_name"] == "activity"
    assert one["model_version"] == service.models["activity"].sha256[:12]
    outputs = {o["name"]: o for o in one["outputs"]}
    assert outputs["scores"]["datatype"] == "FP32" and outputs["scores"]["shape"] == [1, 3]
    status, _, raw = request(service, "POST", "/routes/activity",
                             json.dumps({"id": 7, "data": rows[0].tolist()}).encode())
    mqtt_shaped = json.loads(raw)
    assert status == 200 and mqtt_shaped["id"] == 7
    assert outputs["label"]["data"] == [mqtt_shaped["label"]]
    assert outputs["scores"]["data"] == pytest.approx([t["score"] for t in mqtt_shaped["top_k"]])
    status, _, body = request(service, "POST", "/v2/models/activity/infer", v2_body(rows))
    batch = {o["name"]: o for o in json.loads(body)["outputs"]}
    assert status == 200 and batch["label"]["shape"] == [3] and batch["scores"]["shape"] == [3, 3]
    assert batch["label"]["data"][0] == mqtt_shaped["label"]


def test_a_raw_route_takes_its_bytes_as_sent_and_v2_tensors_of_its_dtype(daemon):
    service, _ = daemon
    row = _activity_rows(1)[0]
    status, _, raw = request(service, "POST", "/routes/activity-raw", row.astype("<f4").tobytes(),
                             headers={**AUTH, "Content-Type": "application/octet-stream"})
    assert status == 200 and json.loads(raw)["id"] is None
    status, _, body = request(service, "POST", "/v2/models/activity-raw/infer", v2_body(row[None]))
    assert status == 200 and json.loads(body)["outputs"][0]["data"] == [json.loads(raw)["label"]]
    status, _, body = request(service, "POST", "/v2/models/activity-raw/infer", v2_body(row[None], datatype="INT32"))
    assert status == 400 and "FP32" in json.loads(body)["error"]


@pytest.mark.parametrize("body, code", [
    (b"{not json", "bad_request"),
    (b"[]", "bad_request"),
    (json.dumps({"inputs": []}).encode(), "bad_request"),
    (json.dumps({"inputs": [{"name": "x", "shape": [1, 99, 6], "datatype": "FP32", "data": [0] * 594}]}).encode(),
     "bad_shape"),
    (json.dumps({"inputs": [{"name": "x", "shape": [100, 6], "datatype": "FP32", "data": [0] * 5}]}).encode(),
     "bad_shape"),
    (json.dumps({"inputs": [{"name": "x", "shape": [100, 6], "datatype": "BYTES", "data": ["a"]}]}).encode(),
     "bad_request"),
    (json.dumps({"inputs": [{"name": "x", "shape": [100, 6], "datatype": "FP32", "data": ["a"] * 600}]}).encode(),
     "bad_request"),
])
def test_a_malformed_v2_body_is_one_json_400(daemon, body, code):
    service, _ = daemon
    status, headers, payload = request(service, "POST", "/v2/models/activity/infer", body)
    error = json.loads(payload)
    assert status == 400 and error["code"] == code and set(error) == {"error", "code", "id"}
    assert headers["Content-Type"] == "application/json"


def test_the_route_path_answers_the_routes_own_errors_with_their_status(daemon):
    service, _ = daemon
    status, _, body = request(service, "POST", "/routes/activity", b'{"id": 3, "data": [1, 2]}')
    assert status == 400 and json.loads(body)["error"]["code"] == "bad_shape" and json.loads(body)["id"] == 3


def test_every_early_error_has_its_status(daemon):
    service, _ = daemon
    status, headers, _ = request(service, "GET", "/v2/models/activity", headers={})
    assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
    assert request(service, "GET", "/v2/models/activity", headers={"Authorization": "Bearer nope"})[0] == 401
    assert request(service, "GET", "/v2/models/nope")[0] == 404
    assert request(service, "POST", "/routes/nope", b"{}")[0] == 404
    assert request(service, "GET", "/elsewhere")[0] == 404
    assert request(service, "GET", "/v2/models/activity/infer")[0] == 405
    status, _, body = request(service, "POST", "/routes/activity", b"x" * 200_001)
    assert status == 413 and json.loads(body)["code"] == "too_large"


def test_a_rate_limited_device_gets_429_with_retry_after_and_another_device_is_served(daemon):
    service, _ = daemon
    body = json.dumps({"data": _activity_rows(1)[0].tolist()}).encode()
    first = request(service, "POST", "/routes/activity-limited", body, headers={**AUTH, "X-Device": "d1"})
    again = request(service, "POST", "/routes/activity-limited", body, headers={**AUTH, "X-Device": "d1"})
    other = request(service, "POST", "/routes/activity-limited", body, headers={**AUTH, "X-Device": "d2"})
    assert first[0] == 200 and other[0] == 200
    assert again[0] == 429 and again[1]["Retry-After"] == "1"
    assert json.loads(again[2])["error"]["code"] == "rate_limited"
    assert request(service, "POST", "/routes/activity", body, headers={**AUTH, "X-Device": "a/b"})[0] == 400


def test_keep_alive_serves_many_requests_on_one_connection_without_a_nagle_stall(daemon):
    service, _ = daemon
    conn = http.client.HTTPConnection("127.0.0.1", service.http_port, timeout=30)
    request(service, "GET", "/v2/health/live", headers={}, conn=conn)
    started = time.monotonic()
    for _ in range(20):
        assert request(service, "GET", "/v2/models/activity/ready", conn=conn)[0] == 200
    per_request = (time.monotonic() - started) / 20
    conn.close()
    assert per_request < 0.03  # a Nagle + delayed-ACK stall is ~40 ms each


def test_a_slow_body_gets_408_and_does_not_block_others(daemon):
    service, _ = daemon
    slow = socket.create_connection(("127.0.0.1", service.http_port))
    body = json.dumps({"data": _activity_rows(1)[0].tolist()}).encode()
    slow.sendall(b"POST /routes/activity HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode() +
                 b"\r\nContent-Length: %d\r\n\r\n" % len(body))
    stop = threading.Event()

    def trickle() -> None:
        for byte in body:
            if stop.wait(0.05):
                return
            try:
                slow.send(bytes([byte]))
            except OSError:
                return
    threading.Thread(target=trickle, daemon=True).start()
    started = time.monotonic()
    assert request(service, "POST", "/routes/activity", body)[0] == 200  # meanwhile: served
    assert time.monotonic() - started < 1.0
    slow.settimeout(10)
    answer = slow.recv(4096)
    stop.set()
    slow.close()
    assert answer.startswith(b"HTTP/1.1 408") and b'"code":"timeout"' in answer


def test_past_max_connections_a_connection_gets_503_and_the_rest_still_work(daemon):
    service, _ = daemon
    held = [socket.create_connection(("127.0.0.1", service.http_port)) for _ in range(8)]
    try:
        time.sleep(0.2)  # the listener accepts them
        extra = socket.create_connection(("127.0.0.1", service.http_port))
        extra.settimeout(10)
        assert extra.recv(4096).startswith(b"HTTP/1.1 503")
        extra.close()
    finally:
        for s in held:
            s.close()
    for _ in range(50):  # their threads end as they see the close
        if request(service, "GET", "/v2/health/live", headers={})[0] == 200:
            break
        time.sleep(0.05)
    assert request(service, "GET", "/v2/models/activity/ready")[0] == 200


def test_requests_are_counted_by_route_and_status(daemon):
    service, _ = daemon
    request(service, "GET", "/v2/models/activity/ready")
    request(service, "GET", "/v2/models/nope")
    counts = service.snapshot()["http"]
    assert counts["activity"]["200"] >= 1 and counts[""]["404"] >= 1


def test_tls_serves_https_with_the_configured_certificate(tmp_path):
    import ssl

    from daemon.config.http import HttpConfig, HttpTlsConfig
    from tests.transport.http_listener import running, self_signed

    cert, key = self_signed(tmp_path)
    with running(HttpConfig(tls=HttpTlsConfig(cert, key))) as listener:
        context = ssl.create_default_context(cafile=str(cert))
        conn = http.client.HTTPSConnection("localhost", listener.port, context=context, timeout=10)
        conn.request("GET", "/v2/health/live")
        assert conn.getresponse().status == 200
        conn.close()
        plain = socket.create_connection(("127.0.0.1", listener.port))  # a client that never handshakes
        plain.sendall(b"GET /v2/health/live HTTP/1.1\r\n\r\n")
        plain.settimeout(10)
        assert not plain.recv(100).startswith(b"HTTP/1.1 200")
        plain.close()


def test_curl_with_expect_100_continue_gets_its_answer_without_waiting(daemon, tmp_path):
    import shutil
    import subprocess

    if shutil.which("curl") is None:
        pytest.skip("no curl")
    service, _ = daemon
    body = tmp_path / "req.json"
    body.write_text(json.dumps(v2_body(_activity_rows(1))))  # > 1 KiB: curl sends Expect: 100-continue
    started = time.monotonic()
    out = subprocess.run(["curl", "-s", "-H", f"Authorization: Bearer {TOKEN}", "-H", "Content-Type: application/json",
                          "--data-binary", f"@{body}", f"http://127.0.0.1:{service.http_port}/v2/models/activity/infer"],
                         capture_output=True, timeout=30, check=True)
    assert json.loads(out.stdout)["id"] == "r1"
    assert time.monotonic() - started < 0.9  # curl waits 1 s for a 100 Continue that does not come


def test_expect_100_continue_is_answered_at_once(daemon):
    service, _ = daemon
    body = json.dumps({"data": _activity_rows(1)[0].tolist()}).encode()
    s = socket.create_connection(("127.0.0.1", service.http_port))
    s.settimeout(5)
    s.sendall(b"POST /routes/activity HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nAuthorization: Bearer " +
              TOKEN.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(body))
    assert s.recv(100).startswith(b"HTTP/1.1 100 Continue")  # before the body is sent
    s.sendall(body)
    assert s.recv(4096).startswith(b"HTTP/1.1 200")
    s.close()


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=st.integers(1, 12), pause_s=st.sampled_from([0.0, 0.01, 0.05, 0.3]))
def test_fuzz_a_body_in_pieces_is_served_when_it_arrives_in_time_else_408(daemon, pieces, pause_s):
    service, _ = daemon
    body = json.dumps({"id": "p", "data": _activity_rows(1)[0].tolist()}).encode()
    s = socket.create_connection(("127.0.0.1", service.http_port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(b"POST /routes/activity HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode() +
              b"\r\nContent-Length: %d\r\n\r\n" % len(body))
    cuts = np.linspace(0, len(body), pieces + 1).astype(int)
    started = time.monotonic()
    try:
        for a, b in zip(cuts[:-1], cuts[1:]):
            time.sleep(pause_s)
            s.sendall(body[a:b])
    except OSError:  # the listener gave up on us and closed: the answer is already waiting
        pass
    sent_s = time.monotonic() - started
    s.settimeout(10)
    answer = s.recv(4096)
    s.close()
    if sent_s < TIMEOUT_MS / 1000.0 * 0.5:
        assert answer.startswith(b"HTTP/1.1 200"), answer
    elif sent_s > TIMEOUT_MS / 1000.0 * 1.5:
        assert answer.startswith(b"HTTP/1.1 408"), answer
    assert answer.split(b"\r\n\r\n", 1)[1].startswith(b"{")  # one JSON answer either way
