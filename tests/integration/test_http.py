"""The HTTP listener on the real daemon (a process) beside MQTT on a real mosquitto: one answer
whichever way a request comes, tritonclient as a client, a hypothesis-driven fuzz of malformed
bodies and slow clients (one JSON error each; the daemon and MQTT unharmed), shedding (503) and
the request timeout (504)."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon.serve.admission import JOB_OVERHEAD_BYTES
from daemon.tools.broker import free_port
from tests.integration import v2_servers
from tests.integration.conftest import LARGE_MODELS, LARGE_ROUTE, ROOT, WAIT_S, write_config

ERROR_KEYS = {"error", "code", "id"}


def _rows(n: int) -> np.ndarray:
    with np.load(ROOT / "models/activity/test.npz") as data:
        return np.round(data["x"][:n].astype(np.float32), 3)


def _call(port: int, method: str, path: str, body: bytes = None, headers: dict = None,
          conn: http.client.HTTPConnection = None) -> tuple[int, dict, bytes]:
    own = conn is None
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT_S)
    conn.request(method, path, body=body, headers=headers or {})
    response = conn.getresponse()
    payload = response.read()
    if own:
        conn.close()
    return response.status, dict(response.getheaders()), payload


def _wait_http(port: int, daemon) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        assert daemon.proc.poll() is None, daemon.log()[-3000:]
        try:
            if _call(port, "GET", "/v2/health/ready")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)  # polling a port that opens once start-up is done; the limit bounds a failure
    pytest.fail("the HTTP listener never became ready:\n" + daemon.log()[-3000:])


@pytest.fixture
def served(tmp_path, client, start_daemon):
    port = free_port()
    config = write_config(tmp_path, http={"port": port}, workers={"max": 1})
    daemon = start_daemon(config, wait_online=client)
    _wait_http(port, daemon)
    return port, daemon, client


def _mqtt_answer(client, device: str, payload: bytes) -> dict:
    topic = f"results/{device}/activity"
    client.subscribe(topic)
    client.publish(f"sensors/{device}/imu", payload)
    return client.wait_json(topic)[0]


def _comparable(reply: dict) -> dict:
    return {k: v for k, v in reply.items() if k not in ("latency_ms", "cached")}


def test_a_request_over_http_and_over_mqtt_gets_the_same_answer(served):
    port, _, client = served
    payload = json.dumps({"id": "same", "data": _rows(1)[0].tolist()}).encode()
    over_mqtt = _mqtt_answer(client, "dev1", payload)
    status, headers, body = _call(port, "POST", "/routes/activity", payload, {"X-Device": "dev2"})
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert _comparable(json.loads(body)) == _comparable(over_mqtt)
    v2 = {"id": "same", "inputs": [{"name": "input", "shape": [1, 100, 6], "datatype": "FP32",
                                     "data": _rows(1)[0].ravel().tolist()}]}
    status, _, body = _call(port, "POST", "/v2/models/activity/infer", json.dumps(v2).encode())
    outputs = {o["name"]: o["data"] for o in json.loads(body)["outputs"]}
    assert status == 200 and outputs["label"] == [over_mqtt["label"]] and outputs["index"] == [over_mqtt["index"]]
    assert outputs["scores"] == pytest.approx([t["score"] for t in over_mqtt["top_k"]])
    assert json.loads(body)["model_version"] == over_mqtt["model_sha256"]


def test_tritonclient_speaks_to_it(served):
    http_client = pytest.importorskip("tritonclient.http")
    port, _, _ = served
    triton = http_client.InferenceServerClient(url=f"127.0.0.1:{port}")
    assert triton.is_server_live() and triton.is_server_ready() and triton.is_model_ready("activity")
    meta = triton.get_model_metadata("activity")
    assert meta["inputs"][0]["shape"] == [-1, 100, 6]
    x = _rows(2)
    for binary in (True, False):  # the binary tensor extension (tritonclient's default), and JSON
        tensor = http_client.InferInput("input", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=binary)
        result = triton.infer("activity", [tensor], request_id="t1",
                              outputs=[http_client.InferRequestedOutput("scores", binary_data=False),
                                       http_client.InferRequestedOutput("label", binary_data=False)])
        assert result.as_numpy("scores").shape == (2, 3)
        assert result.get_response()["id"] == "t1"
    triton.close()


def test_kserve_rest_client_speaks_to_it(served, tmp_path):
    """kserve 0.21's InferenceRESTClient, run by its own venv (scripts/setup_v2.sh), gets for each
    row what the route's own payload gets over POST /routes/activity, in JSON and in binary."""
    reason = v2_servers.available(v2_servers.KSERVE)
    if reason is not None:
        pytest.skip(reason)
    port, _, _ = served
    x = _rows(3)
    np.save(tmp_path / "rows.npy", x)
    run = subprocess.run([str(v2_servers.python_of(v2_servers.KSERVE)), str(v2_servers.APPS / "kserve_client.py"),
                          f"http://127.0.0.1:{port}", "activity", str(tmp_path / "rows.npy")],
                         capture_output=True, text=True, timeout=WAIT_S)
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout)
    assert found["server_live"] and found["server_ready"] and found["model_ready"]
    assert found["metadata"]["inputs"][0]["shape"] == [-1, 100, 6]
    replies = [json.loads(_call(port, "POST", "/routes/activity", json.dumps({"data": row.tolist()}).encode())[2])
               for row in x]
    for way in ("json", "binary"):
        outputs = found[way]["outputs"]
        assert found[way]["id"] == f"kserve-{way == 'binary'}"
        assert outputs["label"]["data"] == [r["label"] for r in replies]
        assert outputs["index"]["data"] == [r["index"] for r in replies]
        assert outputs["scores"]["data"] == pytest.approx([t["score"] for r in replies for t in r["top_k"]])
        assert outputs["scores"]["shape"] == [len(x), len(replies[0]["top_k"])]


_V2_TENSOR = st.fixed_dictionaries({}, optional={
    "name": st.text(max_size=5),
    "shape": st.one_of(st.lists(st.integers(-2, 700), max_size=4), st.text(max_size=3), st.none()),
    "datatype": st.one_of(st.sampled_from(["FP32", "INT8", "BYTES", "BOOL", "FP64", "UINT8", "nope"]), st.integers()),
    "data": st.one_of(st.lists(st.one_of(st.floats(allow_nan=True), st.integers(-10**20, 10**20), st.text(max_size=2),
                                         st.lists(st.floats(), max_size=3)), max_size=30), st.text(), st.none()),
    "parameters": st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
})
_BODIES = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=100).map(str.encode),
    st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                 lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                 max_leaves=10).map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"inputs": st.lists(_V2_TENSOR, max_size=2)},
                          optional={"id": st.one_of(st.text(max_size=8), st.integers()),
                                    "outputs": st.lists(st.fixed_dictionaries({"name": st.text(max_size=6)}),
                                                        max_size=2)}).map(lambda v: json.dumps(v).encode()),
)
_PATHS = st.sampled_from(["/v2/models/activity/infer", "/v2/models/activity-raw/infer", "/routes/activity",
                          "/routes/activity-raw", "/v2/models/nope/infer"])
_HEADER_TEXT = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=6)
_HEADERS = st.fixed_dictionaries({}, optional={
    "Inference-Header-Content-Length": st.one_of(st.integers(-5, 400).map(str), _HEADER_TEXT),
    "X-Device": _HEADER_TEXT,
    "Content-Type": st.sampled_from(["application/json", "text/plain", "application/octet-stream"]),
})


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=_BODIES, path=_PATHS, headers=_HEADERS)
def test_fuzz_malformed_bodies_each_get_one_json_error_and_harm_nothing(served, body, path, headers):
    port, daemon, _ = served
    status, got, payload = _call(port, "POST", path, body, {k: v.strip() for k, v in headers.items()})
    answer = json.loads(payload)  # always one JSON object
    assert isinstance(answer, dict) and got["Content-Type"] == "application/json"
    if status != 200:
        assert 400 <= status < 600 and status != 500, (status, answer)
        assert ERROR_KEYS <= set(answer) or ("error" in answer and "id" in answer and path.startswith("/routes"))
    assert daemon.proc.poll() is None


def test_after_the_fuzz_and_a_slow_client_mqtt_and_http_still_serve(served):
    port, daemon, client = served
    garbage = [b"\x00\xff", b"{", b'{"inputs": [{"shape": [1e9]}]}', b"[" * 5000]
    for body in garbage:
        status, _, payload = _call(port, "POST", "/v2/models/activity/infer", body)
        assert status == 400 and ERROR_KEYS <= set(json.loads(payload))
    slow = socket.create_connection(("127.0.0.1", port))
    slow.sendall(b"POST /routes/activity HTTP/1.1\r\nContent-Length: 5000\r\n\r\n{")
    payload = json.dumps({"id": "after", "data": _rows(1)[0].tolist()}).encode()
    assert _mqtt_answer(client, "dev9", payload)["id"] == "after"  # meanwhile
    assert _call(port, "POST", "/routes/activity", payload)[0] == 200
    slow.settimeout(WAIT_S)
    assert slow.recv(4096).startswith(b"HTTP/1.1 408")
    slow.close()
    bad_line = socket.create_connection(("127.0.0.1", port))
    bad_line.sendall(b"NOT HTTP AT ALL\r\n\r\n")
    bad_line.settimeout(WAIT_S)
    reply = bad_line.recv(4096)
    bad_line.close()
    assert reply.startswith(b"HTTP/1.1 400") and b'"code":"bad_request"' in reply
    assert daemon.proc.poll() is None


@pytest.mark.serial  # an 80 ms request timeout against ~7.5 ms a row: run alone (scripts/test.sh)
def test_a_request_past_its_timeout_gets_504_and_one_past_the_queue_budget_503(tmp_path, client, start_daemon):
    port = free_port()
    route = {**LARGE_ROUTE, "name": "large"}
    with np.load(ROOT / "models/appliance_large/test.npz") as data:
        x = np.round(data["x"][:48].astype(np.float32), 1)
    row_bytes = max(len(json.dumps({"data": row.tolist()})) for row in x) + JOB_OVERHEAD_BYTES
    # The budget holds the first request's 16 rows (~7.5 ms each: 120 ms, past the 80 ms timeout),
    # not the second's 48: what does not fit is answered `overloaded` at once (an HTTP request is
    # QoS 0 to admission: no broker holds it while the daemon stops reading).
    config = write_config(tmp_path, http={"port": port, "request_timeout_ms": 80},
                          workers={"max": 1, "queue_mb": 20 * row_bytes / (1 << 20)},
                          models=LARGE_MODELS, routes=[route])
    daemon = start_daemon(config, wait_online=client)
    _wait_http(port, daemon)

    def v2(rows: np.ndarray, request_id: str) -> bytes:
        return json.dumps({"id": request_id, "inputs": [{"name": "input", "shape": list(rows.shape),
                                                          "datatype": "FP32", "data": rows.ravel().tolist()}]}).encode()
    status, _, body = _call(port, "POST", "/v2/models/large/infer", v2(x[:16], "slow"))
    assert status == 504, body
    assert json.loads(body) == {"error": json.loads(body)["error"], "code": "timeout", "id": "slow"}
    status, headers, body = _call(port, "POST", "/v2/models/large/infer", v2(x, "many"))
    assert status == 503 and headers["Retry-After"] == "1", body
    assert json.loads(body)["code"] == "overloaded" and json.loads(body)["id"] == "many"
    deadline = time.monotonic() + WAIT_S
    while _call(port, "POST", "/v2/models/large/infer", v2(x[:1], "one"))[0] != 200:  # as Retry-After says
        assert time.monotonic() < deadline
        time.sleep(0.5)
    daemon.stop()
    counts = daemon.final_stats()["http"]["large"]
    assert counts["504"] == 1 and counts["503"] >= 1 and counts["200"] == 1


def test_a_request_in_flight_at_sigterm_is_answered_before_the_rest_stops(tmp_path, client, start_daemon):
    import threading

    port = free_port()
    route = {**LARGE_ROUTE, "name": "large"}
    config = write_config(tmp_path, http={"port": port}, workers={"max": 1}, models=LARGE_MODELS, routes=[route])
    daemon = start_daemon(config, wait_online=client)
    _wait_http(port, daemon)
    with np.load(ROOT / "models/appliance_large/test.npz") as data:
        x = np.round(data["x"][:64].astype(np.float32), 1)  # ~0.5 s of work
    body = json.dumps({"id": "inflight", "inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                                                      "data": x.ravel().tolist()}]}).encode()
    answers = []
    sender = threading.Thread(target=lambda: answers.append(_call(port, "POST", "/v2/models/large/infer", body)))
    sender.start()
    time.sleep(0.15)  # the request is in the workers' hands
    daemon.proc.send_signal(15)
    sender.join(WAIT_S)
    assert answers and answers[0][0] == 200, answers
    assert json.loads(answers[0][2])["outputs"][0]["shape"] == [64]
    assert daemon.stop() == 0
    assert daemon.log().index("shutdown: http") < daemon.log().index("shutdown: intake")
