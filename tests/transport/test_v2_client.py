"""The `to_v2` client's pure halves: an infer request's bytes (JSON and the binary tensor
extension) and a response's scores, with each malformed response named in its error."""

from __future__ import annotations

import json

import numpy as np
import pytest

from daemon.config.escalate_v2 import V2TierConfig
from daemon.transport.v2_client import HEADER_LENGTH, V2CallError, decode_scores, encode_infer

ROWS = np.arange(2 * 3 * 1, dtype=np.float32).reshape(2, 3, 1) / 7.0


def tier(**kw) -> V2TierConfig:
    return V2TierConfig(url="http://h:1/prefix", model="m", **kw)


def test_json_request_carries_the_rows_along_the_batch_dimension_and_the_token():
    body, headers = encode_infer(tier(input_name="x", output="probs", token="t" * 20), ROWS, "9")
    request = json.loads(body)
    tensor = request["inputs"][0]
    assert (tensor["name"], tensor["shape"], tensor["datatype"]) == ("x", [2, 3, 1], "FP32")
    np.testing.assert_array_equal(np.asarray(tensor["data"], dtype=np.float32), ROWS.reshape(-1))
    assert request["outputs"] == [{"name": "probs", "parameters": {}}] and request["id"] == "9"
    assert headers["Authorization"] == "Bearer " + "t" * 20 and headers["Content-Type"] == "application/json"
    assert tier(version="3").infer_path == "/prefix/v2/models/m/versions/3/infer"


def test_binary_request_puts_the_rows_after_the_json_header():
    body, headers = encode_infer(tier(binary=True, input_datatype="FP64"), ROWS, "1")
    cut = int(headers[HEADER_LENGTH])
    head = json.loads(body[:cut])
    assert head["inputs"][0]["parameters"]["binary_data_size"] == ROWS.size * 8 == len(body) - cut
    assert "data" not in head["inputs"][0] and head["parameters"] == {"binary_data_output": True}
    np.testing.assert_array_equal(np.frombuffer(body[cut:], dtype="<f8"), ROWS.reshape(-1))


def response(outputs, tail=b""):
    head = json.dumps({"model_name": "m", "model_version": 2, "outputs": outputs}).encode()
    return head + tail, (str(len(head)) if tail else None)


def test_scores_come_from_the_named_output_in_json_or_binary():
    scores = np.array([[0.1, 0.9], [0.7, 0.3]], dtype=np.float32)
    other = {"name": "embedding", "shape": [2, 1], "datatype": "FP32", "parameters": {"binary_data_size": 8}}
    wanted = {"name": "probs", "shape": [2, 2], "datatype": "FP32", "parameters": {"binary_data_size": 16}}
    body, cut = response([other, wanted], np.zeros(2, "<f4").tobytes() + scores.astype("<f4").tobytes())
    got, version = decode_scores(tier(output="probs"), body, cut, 2)
    np.testing.assert_array_equal(got, scores)
    assert version == "2"
    body, cut = response([{"name": "probs", "shape": [2, 2], "datatype": "FP64", "data": scores.tolist()}])
    np.testing.assert_allclose(decode_scores(tier(), body, cut, 2)[0], scores)


@pytest.mark.parametrize("outputs, message", [
    ([], "no outputs"),
    ([{"name": "other", "shape": [2, 2], "datatype": "FP32", "data": [0] * 4}], "no output 'probs'"),
    ([{"name": "probs", "shape": [1, 2], "datatype": "FP32", "data": [0] * 2}], "not 2 rows"),
    ([{"name": "probs", "shape": [2, 2], "datatype": "FP32", "data": [0] * 3}], "does not hold shape [2, 2]"),
    ([{"name": "probs", "shape": [2, 1], "datatype": "BYTES", "data": ["a", "b"]}], "datatype 'BYTES'"),
    ([{"name": "probs", "shape": [2, 1], "datatype": "FP32", "data": ["x", 1]}], "does not hold shape"),
])
def test_a_malformed_response_is_named(outputs, message):
    body, cut = response(outputs)
    with pytest.raises(V2CallError, match=message.replace("[", r"\[").replace("]", r"\]")):
        decode_scores(tier(output="probs"), body, cut, 2)


def test_non_finite_scores_and_garbage_are_refused():
    with pytest.raises(V2CallError, match="NaN or infinity"):
        body, cut = response([{"name": "s", "shape": [1, 2], "datatype": "FP32", "parameters": {"binary_data_size": 8}}],
                             np.array([np.nan, 1], "<f4").tobytes())
        decode_scores(tier(), body, cut, 1)
    with pytest.raises(V2CallError, match="not JSON"):
        decode_scores(tier(), b"Internal Server Error", None, 1)
