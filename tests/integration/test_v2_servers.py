"""The real v2 servers of tests/integration/v2_servers.py (MLServer, KServe) serve appliance_large
as the far tier's contract says: a batch of far rows in one request gets each row's scores exactly
as edge-inferd's own runtime gives them; KServe also over the binary tensor extension, both ways;
a wrong shape or datatype is a JSON 4xx and the server serves on, on the same connection; a
SIGKILLed server comes back on the same url. Skipped, saying why, without scripts/setup_v2.sh's venvs.
"""

from __future__ import annotations

import http.client
import json
import signal
from typing import Optional

import numpy as np
import pytest

from tests.integration import v2_servers

ROWS = 6
ATOL = 1e-6
WAIT_S = 60.0
JSON = {"Content-Type": "application/json"}
HEADER_LENGTH = "Inference-Header-Content-Length"


def _infer(server, body: bytes, headers: dict,
           conn: http.client.HTTPConnection = None) -> tuple[int, dict, bytes]:
    own = conn is None
    conn = conn or http.client.HTTPConnection(v2_servers.LOOPBACK, server.port, timeout=WAIT_S)
    conn.request("POST", f"/v2/models/{server.model}/infer", body=body, headers=headers)
    response = conn.getresponse()
    payload = response.read()
    if own:
        conn.close()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, payload


def _request(rows: np.ndarray, shape=None, request_id: Optional[str] = "r1", datatype: str = "FP32") -> bytes:
    shape = list(rows.shape) if shape is None else shape
    body = {"inputs": [{"name": "x", "shape": shape, "datatype": datatype, "data": rows.ravel().tolist()}]}
    return json.dumps(body if request_id is None else {"id": request_id, **body}).encode()


def _scores(payload: bytes) -> np.ndarray:
    (output,) = json.loads(payload)["outputs"]
    assert output["name"] == "scores" and output["datatype"] == "FP32", output
    return np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])


def test_a_batch_of_far_rows_gets_the_daemons_own_scores(v2_server):
    rows = v2_servers.far_rows(ROWS)
    expected = v2_servers.daemon_scores(rows)
    for shape in (list(rows.shape), list(rows.shape[:2])):  # [N, 1460, 1] and [N, 1460]
        status, _, payload = _infer(v2_server, _request(rows, shape), JSON)
        assert status == 200, payload
        assert json.loads(payload)["id"] == "r1"
        np.testing.assert_allclose(_scores(payload), expected, rtol=0, atol=ATOL)
    status, _, payload = _infer(v2_server, _request(rows, request_id=None), JSON)  # an id is optional
    assert status == 200, payload
    np.testing.assert_allclose(_scores(payload), expected, rtol=0, atol=ATOL)
    assert len(set(expected.argmax(axis=1))) > 2  # rows of several appliances, not one answer repeated


def test_model_metadata_states_the_contract(v2_server):
    status, payload = v2_server.get(f"/v2/models/{v2_server.model}")
    meta = json.loads(payload)
    assert status == 200 and meta["name"] == v2_servers.MODEL_NAME, payload
    assert [(t["datatype"], t["shape"]) for t in meta["inputs"]] == [("FP32", [-1, 1460, 1])]
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["outputs"]] == [("scores", "FP32", [-1, 10])]


def _binary_request(rows: np.ndarray, binary_output: bool) -> tuple[bytes, dict]:
    raw = rows.astype("<f4").tobytes()
    header = json.dumps({"id": "b1", "inputs": [{"name": "x", "shape": list(rows.shape), "datatype": "FP32",
                                                 "parameters": {"binary_data_size": len(raw)}}],
                         "parameters": {"binary_data_output": binary_output}}).encode()
    return header + raw, {HEADER_LENGTH: str(len(header)), "Content-Type": "application/octet-stream"}


def test_kserve_takes_and_gives_the_binary_tensor_extension(kserve_v2):
    rows = v2_servers.far_rows(ROWS)
    expected = v2_servers.daemon_scores(rows)
    body, headers = _binary_request(rows, binary_output=True)
    status, got, payload = _infer(kserve_v2, body, headers)
    assert status == 200, payload
    length = int(got[HEADER_LENGTH.lower()])
    (output,) = json.loads(payload[:length])["outputs"]
    assert output["parameters"]["binary_data_size"] == len(payload) - length == expected.nbytes
    scores = np.frombuffer(payload[length:], dtype="<f4").reshape(output["shape"])
    np.testing.assert_allclose(scores, expected, rtol=0, atol=ATOL)
    body, headers = _binary_request(rows, binary_output=False)  # binary in, JSON out
    status, got, payload = _infer(kserve_v2, body, headers)
    assert status == 200 and HEADER_LENGTH.lower() not in got, payload
    np.testing.assert_allclose(_scores(payload), expected, rtol=0, atol=ATOL)


def test_what_each_server_refuses_that_a_v2_client_may_send(mlserver_v2, kserve_v2):
    """Pinned so that a client (escalate.to_v2) knows: KServe needs `Content-Type:
    application/json` on JSON; MLServer takes no binary extension over REST (and answers it
    application/octet-stream with a plain-text 500)."""
    rows = v2_servers.far_rows(2)
    status, _, payload = _infer(kserve_v2, _request(rows), {})
    assert status == 400 and HEADER_LENGTH.lower() in json.loads(payload)["error"], payload
    body, headers = _binary_request(rows, binary_output=False)
    status, got, _ = _infer(mlserver_v2, body, headers)
    assert status == 500 and got["content-type"].startswith("text/plain")
    status, _, _ = _infer(mlserver_v2, body, {HEADER_LENGTH: headers[HEADER_LENGTH]})
    assert status == 422
    for server in (mlserver_v2, kserve_v2):
        assert _infer(server, _request(rows), JSON)[0] == 200


@pytest.mark.parametrize("bad", ["shape", "size", "datatype", "two inputs"])
def test_a_wrong_request_gets_a_json_4xx_and_the_connection_serves_on(v2_server, bad):
    rows = v2_servers.far_rows(2)
    body = {"shape": _request(rows[:, :100], [2, 100]),
            "size": _request(rows[:, :100], list(rows.shape)),
            "datatype": _request(rows.astype(np.int32), datatype="INT32"),
            "two inputs": json.dumps({"inputs": [json.loads(_request(rows))["inputs"][0]] * 2}).encode()}[bad]
    conn = http.client.HTTPConnection(v2_servers.LOOPBACK, v2_server.port, timeout=WAIT_S)
    status, got, payload = _infer(v2_server, body, JSON, conn)
    assert 400 <= status < 500 and got["content-type"] == "application/json", (status, payload)
    assert json.loads(payload)["error"]
    status, _, payload = _infer(v2_server, _request(rows), JSON, conn)  # the same keep-alive connection
    conn.close()
    assert status == 200 and v2_server.alive()
    np.testing.assert_allclose(_scores(payload), v2_servers.daemon_scores(rows), rtol=0, atol=ATOL)


def test_a_sigkilled_server_comes_back_on_the_same_url(v2_server):
    url = v2_server.url
    v2_server.kill(signal.SIGKILL)
    assert v2_server.get("/v2/health/ready")[0] == 0
    v2_server.restart()
    assert v2_server.url == url and v2_server.get(f"/v2/models/{v2_server.model}/ready")[0] == 200
    assert _infer(v2_server, _request(v2_servers.far_rows(1)), JSON)[0] == 200
