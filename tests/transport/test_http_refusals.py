"""A request refused before its body is read (401: no token; 413: past max_body_bytes) still gets
its answer, over plain HTTP and TLS, from clients that write the whole body before they read:
http.client and tritonclient (over https). Closing with the body unread made them see
BrokenPipeError or SSLEOFError instead (daemon/transport/http_body.py says why).

A real listener on a free port (tests/transport/http_listener.py), real sockets, real clients."""

from __future__ import annotations

import http.client
import json
import ssl

import numpy as np
import pytest

from daemon.config.http import HttpConfig, HttpTlsConfig
from tests.transport.http_listener import TOKEN, bundled_routes, running, self_signed

LIMIT = 200_000
SIZES = (900_000, 5_000_000)
REPEATS = 3  # over plain HTTP the reset lost the answer only some of the time
WAIT_S = 30
PATH = "/routes/activity"
REFUSALS = {401: ({}, "unauthorized"), 413: ({"Authorization": f"Bearer {TOKEN}"}, "too_large")}


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    return self_signed(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module", params=["plain", "tls"])
def listener(request, cert):
    tls = HttpTlsConfig(*cert) if request.param == "tls" else None
    with running(HttpConfig(token=TOKEN, max_body_bytes=LIMIT, tls=tls), bundled_routes()) as listener:
        yield listener


def _connection(listener, cert) -> http.client.HTTPConnection:
    if listener.config.tls is None:
        return http.client.HTTPConnection("127.0.0.1", listener.port, timeout=WAIT_S)
    context = ssl.create_default_context(cafile=str(cert[0]))
    return http.client.HTTPSConnection("localhost", listener.port, context=context, timeout=WAIT_S)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("status", sorted(REFUSALS))
def test_http_client_sees_the_refusal_of_a_large_body(listener, cert, status, size):
    headers, code = REFUSALS[status]
    body = bytes(size)
    for _ in range(REPEATS):
        conn = _connection(listener, cert)
        try:
            conn.request("POST", PATH, body=body, headers={**headers, "Content-Type": "application/json"})
            response = conn.getresponse()
            answer = json.loads(response.read())
        finally:
            conn.close()
        assert (response.status, answer["code"]) == (status, code), answer
        assert response.getheader("Connection") == "close"


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("status", sorted(REFUSALS))
def test_tritonclient_over_https_sees_the_refusal(cert, status, size):
    triton = pytest.importorskip("tritonclient.http")
    from gevent import ssl as gevent_ssl
    from tritonclient.utils import InferenceServerException

    headers, _ = REFUSALS[status]
    x = np.zeros((size // (600 * 4), 100, 6), dtype=np.float32)  # binary tensor extension: 2,400 bytes a row
    tensor = triton.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    config = HttpConfig(token=TOKEN, max_body_bytes=LIMIT, tls=HttpTlsConfig(*cert))
    with running(config, bundled_routes()) as listener:
        client = triton.InferenceServerClient(
            url=f"localhost:{listener.port}", ssl=True, network_timeout=WAIT_S,
            ssl_context_factory=lambda **_: gevent_ssl.create_default_context(cafile=str(cert[0])))
        try:
            with pytest.raises(InferenceServerException) as refused:
                client.infer("activity", [tensor], headers=dict(headers))
        finally:
            client.close()
    assert refused.value.status() == str(status), refused.value
