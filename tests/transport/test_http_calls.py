"""The replies' way back to HTTP handlers, and the v2 codec, without sockets."""

from __future__ import annotations

import io
import json
from contextlib import nullcontext

import numpy as np
import orjson
import pytest

from daemon.config.schema import InputConfig, RouteConfig
from daemon.transport import v2_codec
from daemon.transport.http_calls import Calls, Switchboard
from daemon.transport.inbound import Inbound


class Link:
    def __init__(self):
        self.replies, self.acks, self.published = [], [], []

    def reply(self, topic, payload, inbound):
        self.replies.append((topic, payload, inbound))

    def ack(self, inbound):
        self.acks.append(inbound)

    def publish(self, topic, payload, retain=False, correlation_data=None, **options):
        self.published.append((topic, payload, options))

    def batch(self):
        return nullcontext()


def _route(fmt: str = "json", dtype: str = "float32", kind: str = "classify") -> RouteConfig:
    return RouteConfig(name="r", subscribe="s/+/x", model="m", input=InputConfig(format=fmt, shape=(2, 3), dtype=dtype),
                       preprocess=(), top_k=2, publish="out/{1}", kind=kind)


def test_http_replies_reach_their_call_and_mqtt_ones_the_link_even_on_an_http_like_topic():
    link = Link()
    calls = Calls(lambda inbounds: [board.reply(i.response_topic, b'{"n":%d}' % -i.mid, i) for i in inbounds])
    board = Switchboard(link, calls)
    assert calls.serve("s/d/x", [b"a", b"b"], 0.0, 5.0) is not None
    spoofed = Inbound("s/d/x", b"", 1, 1, 0.0, response_topic="$http/1")  # an MQTT v5 request asking for it
    board.reply("$http/1", b"mqtt", spoofed)
    board.ack(spoofed)
    assert link.replies == [("$http/1", b"mqtt", spoofed)] and link.acks == [spoofed]
    board.publish("far/x", b"p", correlation_data=b"c", response_topic="back")
    assert link.published == [("far/x", b"p", {"response_topic": "back"})]


def test_rows_come_back_in_order_an_error_ends_the_wait_and_a_late_reply_is_dropped():
    held = []
    calls = Calls(held.extend, clock=lambda: 0.0)
    board = Switchboard(Link(), calls)
    assert calls.serve("s/d/x", [b"a"], 0.0, 0.0) is None  # nobody answered in time: 504
    board.reply("$http/1", b"late", held[0])
    assert calls.late == 1 and calls.waiting == 0

    def answer(inbounds):
        second.reply("", b'{"id":null,"route":"r","error":{"code":"overloaded"}}', inbounds[1])
    waiting = Calls(answer)
    second = Switchboard(Link(), waiting)
    replies = waiting.serve("s/d/x", [b"a", b"b", b"c"], 0.0, 60.0)
    assert replies[0] is None and b"overloaded" in replies[1]


def test_v2_rows_become_the_routes_own_payloads():
    x = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
    body = {"id": "q", "inputs": [{"name": "input", "shape": [2, 2, 3], "datatype": "FP32", "data": x.tolist()}]}
    parsed = v2_codec.parse_infer(json.dumps(body).encode(), _route())
    assert parsed.request_id == "q" and [orjson.loads(p)["data"] for p in parsed.payloads] == [[0, 1, 2, 3, 4, 5],
                                                                                               [6, 7, 8, 9, 10, 11]]
    raw = v2_codec.parse_infer(json.dumps(body).encode(), _route("raw")).payloads
    assert raw == [x[0].astype("<f4").tobytes(), x[1].astype("<f4").tobytes()]
    npy = v2_codec.parse_infer(json.dumps(body).encode(), _route("npy")).payloads
    assert np.array_equal(np.load(io.BytesIO(npy[1])), x[1])


def test_the_binary_tensor_extension_is_read_as_tritonclient_sends_it():
    x = np.ones((1, 2, 3), dtype=np.float32)
    header = json.dumps({"inputs": [{"name": "input", "shape": [1, 2, 3], "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}]}).encode()
    parsed = v2_codec.parse_infer(header + x.tobytes(), _route("raw"), len(header))
    assert parsed.payloads == [x[0].tobytes()]
    with pytest.raises(v2_codec.V2Error, match="binary_data_size"):
        v2_codec.parse_infer(header + x.tobytes()[:-4], _route("raw"), len(header))


@pytest.mark.parametrize("tensor, code", [
    ({"shape": [3, 2], "datatype": "FP32", "data": [0] * 6}, "bad_shape"),
    ({"shape": [2, 3], "datatype": "INT8", "data": [0] * 6}, "bad_request"),  # a raw float32 route
    ({"shape": [2, 3], "datatype": "FP32", "data": [0] * 5}, "bad_shape"),
    ({"shape": [2, 3], "datatype": "FP32", "data": [[0, 1], [2]]}, "bad_request"),
])
def test_a_tensor_the_route_cannot_take_is_a_400_with_its_code(tensor, code):
    with pytest.raises(v2_codec.V2Error) as caught:
        v2_codec.parse_infer(json.dumps({"inputs": [{"name": "input", **tensor}]}).encode(), _route("raw"))
    assert caught.value.code == code


def test_a_classify_response_is_valid_v2_and_keeps_the_asked_outputs_in_order():
    reply = {"id": None, "route": "r", "label": "b", "index": 1, "score": 0.75, "cached": False,
             "model_sha256": "abcdef012345", "top_k": [{"label": "b", "score": 0.75}, {"label": "a", "score": 0.25}]}
    out = v2_codec.infer_response(_route(), 7, [reply, reply], asked=("scores", "label"))
    assert out["model_version"] == "abcdef012345" and out["id"] == "7"
    assert [(o["name"], o["datatype"], o["shape"]) for o in out["outputs"]] == [("scores", "FP32", [2, 2]),
                                                                                 ("label", "BYTES", [2])]
    assert out["outputs"][0]["data"] == [0.75, 0.25, 0.75, 0.25]


def test_a_v2_int16_tensor_becomes_a_pcm16_routes_own_payload():
    route = _route("pcm16", "int16")
    samples = [-32768, -1, 0, 1, 32767, 7]
    body = {"inputs": [{"name": "input", "shape": list(route.input.shape), "datatype": "INT16", "data": samples}]}
    assert v2_codec.route_datatype(route) == "INT16"
    (payload,) = v2_codec.parse_infer(orjson.dumps(body), route).payloads
    assert payload == np.asarray(samples, "<i2").tobytes()  # what a microphone would have published
