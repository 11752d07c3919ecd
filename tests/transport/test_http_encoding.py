"""Compressed request bodies (Content-Encoding: gzip or deflate, as tritonclient's
request_compression_algorithm sends them) are inflated and served like the plain ones; the size
bound holds after inflating (a decompression bomb is 413), and an encoding not taken is 415.

The real Service in this process with a real mosquitto (tests/transport/test_http_server.py's
fixture: max_body_bytes 200,000), requests over real sockets."""

from __future__ import annotations

import gzip
import http.client
import json
import zlib

import pytest

from tests.transport.test_http_server import AUTH, _activity_rows, daemon, request  # noqa: F401 - a fixture

BOMB_BYTES = 50_000_000  # inflates 250x past max_body_bytes; ~50 KB on the wire


def test_tritonclient_with_request_compression_gets_what_the_plain_request_gets(daemon):  # noqa: F811
    triton = pytest.importorskip("tritonclient.http")
    service, _ = daemon
    client = triton.InferenceServerClient(url=f"127.0.0.1:{service.http_port}")
    x = _activity_rows(2)
    answers = {}
    try:
        for algorithm in (None, "gzip", "deflate"):
            for binary in (True, False):
                tensor = triton.InferInput("input", list(x.shape), "FP32")
                tensor.set_data_from_numpy(x, binary_data=binary)
                result = client.infer("activity", [tensor], headers=dict(AUTH), request_compression_algorithm=algorithm,
                                      outputs=[triton.InferRequestedOutput("label", binary_data=False),
                                               triton.InferRequestedOutput("scores", binary_data=False)])
                answers[algorithm, binary] = (result.as_numpy("label").tolist(), result.as_numpy("scores").tolist())
    finally:
        client.close()
    assert len({json.dumps(a) for a in answers.values()}) == 1, answers


def test_a_gzip_bomb_is_refused_413_and_the_connection_still_serves(daemon):  # noqa: F811
    service, _ = daemon
    bomb = gzip.compress(bytes(BOMB_BYTES))
    conn = http.client.HTTPConnection("127.0.0.1", service.http_port, timeout=30)
    try:
        status, _, body = request(service, "POST", "/routes/activity", bomb, headers={**AUTH, "Content-Encoding": "gzip"},
                                  conn=conn)
        assert len(bomb) < 200_000 and status == 413, body
        assert json.loads(body)["code"] == "too_large" and "inflates" in json.loads(body)["error"]
        good = json.dumps({"id": "after", "data": _activity_rows(1)[0].tolist()}).encode()
        status, _, body = request(service, "POST", "/routes/activity", zlib.compress(good),
                                  headers={**AUTH, "Content-Encoding": "deflate"}, conn=conn)  # read whole: kept alive
        assert status == 200 and json.loads(body)["id"] == "after", body
    finally:
        conn.close()


@pytest.mark.parametrize("encoding, body, status", [
    ("br", b"\x0b\x02\x80{}\x03", 415),
    ("gzip", b"not gzip at all", 400),
    ("gzip", gzip.compress(b'{"data": [1]}')[:-6], 400),  # truncated
], ids=["brotli", "not-gzip", "truncated"])
def test_an_encoding_not_taken_is_415_and_a_broken_stream_400(daemon, encoding, body, status):  # noqa: F811
    service, _ = daemon
    got, headers, payload = request(service, "POST", "/routes/activity", body,
                                    headers={**AUTH, "Content-Encoding": encoding})
    assert got == status, payload
    if status == 415:
        assert "Content-Encoding" in json.loads(payload)["error"] and headers["Connection"] == "close"
