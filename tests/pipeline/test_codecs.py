"""Decoding requests: formats, size limit first, shape/dtype/finite checks, error codes."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from daemon.pipeline import codecs
from daemon.config.schema import InputConfig
from daemon.errors import PayloadError

SPEC = InputConfig(format="json", shape=(4, 2), dtype="float32", max_bytes=1000)


def _code(payload: bytes, spec: InputConfig = SPEC) -> str:
    with pytest.raises(PayloadError) as err:
        codecs.decode(payload, spec)
    return err.value.code


def test_json_nested_or_flat_with_any_id():
    nested = codecs.decode(json.dumps({"id": {"k": [1]}, "data": [[1, 2]] * 4}).encode(), SPEC)
    flat = codecs.decode(json.dumps({"id": 7, "data": list(range(8))}).encode(), SPEC)
    assert nested.request_id == {"k": [1]} and nested.data.shape == (4, 2) and nested.data.dtype == np.float32
    assert flat.data[3].tolist() == [6.0, 7.0]


def test_raw_little_endian_and_npy():
    x = np.arange(8, dtype="<f4").reshape(4, 2)
    raw = codecs.decode(x.tobytes(), InputConfig(format="raw", shape=(4, 2)))
    buf = io.BytesIO()
    np.save(buf, x.astype(np.int16))
    npy = codecs.decode(buf.getvalue(), InputConfig(format="npy", shape=(4, 2)))
    assert raw.request_id is None and np.array_equal(raw.data, x) and np.array_equal(npy.data, x)
    int16 = InputConfig(format="raw", shape=(4, 2), dtype="int16")
    assert codecs.decode(x.astype("<i2").tobytes(), int16).data[3, 1] == 7


def test_size_limit_is_checked_before_parsing():
    assert _code(b"{" * 1001) == "too_large"  # would be bad_payload if it were parsed first


@pytest.mark.parametrize("payload,code", [
    (b"\xff\xfe", "bad_payload"),
    (b"[1, 2]", "bad_payload"),
    (b'{"id": 1}', "bad_payload"),
    (b'{"id": 1, "data": ["a"]}', "bad_payload"),
    (b'{"id": 1, "data": [1, 2, 3]}', "bad_shape"),
    (b'{"id": 1, "data": [[1, 2], [3]]}', "bad_shape"),
    (b'{"id": 1, "data": [NaN, 1, 2, 3, 4, 5, 6, 7]}', "bad_payload"),
    (b'{"id": 1, "data": [1, 2, 3, 4, 5, 6, 7, Infinity]}', "bad_payload"),
    (b'{"id": 1, "data": [1, 2, 3, 4, 5, 6, 7, 1e300]}', "bad_payload"),  # finite in JSON, inf in float32
    (b'{"id": 1, "timeout_ms": -5, "data": [1, 2, 3, 4, 5, 6, 7, 8]}', "bad_payload"),
])
def test_bad_json_requests(payload, code):
    assert _code(payload) == code


def test_errors_keep_the_request_id_when_it_was_readable():
    with pytest.raises(PayloadError) as err:
        codecs.decode(b'{"id": "abc", "data": [1]}', SPEC)
    assert err.value.request_id == "abc"


def test_float64_npy_beyond_float32_is_refused():
    buf = io.BytesIO()
    np.save(buf, np.full((4, 2), 1e300))
    assert _code(buf.getvalue(), InputConfig(format="npy", shape=(4, 2))) == "bad_payload"


def test_bad_raw_and_npy():
    assert _code(b"\0" * 31, InputConfig(format="raw", shape=(4, 2))) == "bad_shape"
    assert _code(b"not an npy", InputConfig(format="npy", shape=(4, 2))) == "bad_payload"
    buf = io.BytesIO()
    np.save(buf, np.array(["a"] * 8))
    assert _code(buf.getvalue(), InputConfig(format="npy", shape=(4, 2))) == "bad_payload"
    buf = io.BytesIO()
    np.save(buf, np.array([{"x": 1}], dtype=object), allow_pickle=True)
    assert _code(buf.getvalue(), InputConfig(format="npy", shape=(4, 2))) == "bad_payload"  # never unpickled


@pytest.mark.parametrize("payload,expected", [
    (b'{"id": 5, "data": []}', 5),
    (b'{ "id" : "dev-7\\"x", "data": [1]}', 'dev-7"x'),
    (b'{"data": [1], "id": null}', None),
    (b'{"id": -1.5e3}', -1500.0),
    (b'{"id": true, "data": 1}', True),
    (b'{"id": {"nested": 1}, "data": 1}', None),  # only scalars are scanned
    (b"junk", None),
    (b'{"data": [' + b"1, " * 200 + b'1], "id": 9}', None),  # beyond the scanned prefix
])
def test_scan_id_reads_a_leading_scalar_id_without_parsing_the_payload(payload, expected):
    assert codecs.scan_id(payload, SPEC) == expected


def test_scan_id_is_none_for_binary_formats_and_encode_is_compact_json():
    assert codecs.scan_id(b'{"id": 5}', InputConfig(format="raw", shape=(1,))) is None
    reply = codecs.error_reply(5, "r", "overloaded", "full")
    expected = {"id": 5, "route": "r", "error": {"code": "overloaded", "message": "full"}}
    assert json.loads(codecs.encode(reply)) == expected


def test_deeply_nested_json_is_bad_payload_not_a_crash():
    deep = b'{"id": "deep", "data": ' + b"[" * 5000 + b"1" + b"]" * 5000 + b"}"
    assert _code(deep, InputConfig(format="json", shape=(4, 2))) == "bad_payload"


def test_a_readable_id_is_kept_when_data_is_missing():
    with pytest.raises(PayloadError) as err:
        codecs.decode(b'{"id": "x"}', SPEC)
    assert err.value.code == "bad_payload" and err.value.request_id == "x"


@pytest.mark.parametrize("data,code", [
    ([[1, 2], [3]], "bad_shape"),           # ragged rows
    ([[1, 2], 3], "bad_shape"),             # a number beside a row
    ([[1, 2], ["a", "b"]], "bad_payload"),  # strings
    ([[1, None], [2, 3]], "bad_payload"),
])
def test_nested_lists_must_be_rectangular_and_numeric(data, code):
    assert _code(json.dumps({"id": 1, "data": data}).encode(), InputConfig(format="json", shape=(2, 2))) == code


def test_nested_and_flat_lists_give_the_same_array():
    values = np.arange(12, dtype=np.float32).reshape(2, 3, 2)
    spec = InputConfig(format="json", shape=(2, 3, 2))
    nested = codecs.decode(json.dumps({"data": values.tolist()}).encode(), spec).data
    flat = codecs.decode(json.dumps({"data": values.ravel().tolist()}).encode(), spec).data
    assert np.array_equal(nested, values) and np.array_equal(flat, values)


def _png(array: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


def test_image_rgb_and_gray_decode_to_the_route_shape():
    rgb = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)
    decoded = codecs.decode(_png(rgb), InputConfig(format="image", shape=(4, 6, 3)))
    assert decoded.data.dtype == np.uint8 and np.array_equal(decoded.data, rgb)  # pixels, as decoded
    gray = codecs.decode(_png(rgb), InputConfig(format="image", shape=(4, 6)))  # converted to luma by Pillow
    assert gray.data.shape == (4, 6)


def test_an_image_of_another_size_is_resized_and_says_where_it_lies():
    decoded = codecs.decode(_png(np.zeros((5, 8, 3), np.uint8)), InputConfig(format="image", shape=(4, 6, 3)))
    assert decoded.data.shape == (4, 6, 3) and decoded.request_id is None
    assert (decoded.geometry.width, decoded.geometry.height) == (8, 5)
    assert (decoded.geometry.input_width, decoded.geometry.input_height) == (6, 4)
    boxed = codecs.decode(_png(np.zeros((8, 16, 3), np.uint8)),
                          InputConfig(format="image", shape=(8, 8, 3), resize="letterbox"))
    assert (boxed.geometry.scale_x, boxed.geometry.scale_y, boxed.geometry.pad_x, boxed.geometry.pad_y) == (0.5, 0.5, 0, 2)


def test_bad_images():
    assert _code(b"\x89PNG not really", InputConfig(format="image", shape=(4, 6))) == "bad_payload"
    assert _code(_png(np.zeros((50, 60, 3), np.uint8)), InputConfig(format="image", shape=(4, 6, 3),
                                                                    max_pixels=2999)) == "too_large"


def test_an_encoded_reply_holds_no_more_memory_than_its_bytes():
    import tracemalloc

    from daemon.pipeline.codecs import encode

    reply = {"id": 1, "route": "activity", "label": "walking", "score": 0.98, "cached": False}
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [encode(reply) for _ in range(100)]
        per_reply = (tracemalloc.get_traced_memory()[0] - before) / len(kept)
    finally:
        tracemalloc.stop()
    assert per_reply < 4 * len(kept[0]) + 200  # orjson's own object holds ~4 KB


GROUP_SPEC = InputConfig(format="json", shape=(4, 2), dtype="float32", max_bytes=1000)
GROUP = [
    json.dumps({"id": 0, "data": [[1, 2]] * 4}).encode(),
    b"\xff\xfe",
    json.dumps({"id": 2, "data": list(range(8)), "timeout_ms": 5}).encode(),
    b'{"id": 3, "data": [[1, 2], [3]]}',
    json.dumps({"id": 4, "data": [[[1], [2]]] * 4}).encode(),  # three levels
    b'{"id": 5, "data": ["a"]}',  # not a number and the wrong size: bad_payload, as alone
    b'{"id": 6, "data": [1, 2, 3]}',
    b'{"id": 7, "data": [1, 2, 3, 4, 5, 6, 7, 1e300]}',  # inf in float32: decoded, left to the finite check
    b"{" * 1001,
    json.dumps({"id": 9, "data": [[0.5, -1]] * 4}).encode(),
]


def _alone(payload: bytes):
    try:
        return codecs.decode(payload, GROUP_SPEC, check_finite=False)
    except PayloadError as exc:
        return exc


@pytest.mark.parametrize("group", [GROUP, GROUP[:1], [GROUP[1]], [GROUP[0], b'{"id": 1, "data": [1, 2, 3, 4, "x", 6, 7, 8]}']])
def test_a_group_decodes_as_each_request_would_alone_into_one_array(group):
    batch = codecs.decode_many(group, GROUP_SPEC)
    alone = [_alone(p) for p in group]
    assert [i for i, _ in batch.errors] == [i for i, a in enumerate(alone) if isinstance(a, PayloadError)]
    for i, exc in batch.errors:
        assert (exc.code, exc.message, exc.request_id) == (alone[i].code, alone[i].message, alone[i].request_id)
    assert [i for i, _ in batch.decoded] == [i for i, a in enumerate(alone) if not isinstance(a, PayloadError)]
    assert batch.x.shape == (len(batch.decoded), 4, 2) and batch.x.dtype == np.float32
    for row, (i, d) in enumerate(batch.decoded):
        assert (d.request_id, d.timeout_ms) == (alone[i].request_id, alone[i].timeout_ms)
        assert np.array_equal(batch.x[row], alone[i].data) and np.array_equal(d.data, alone[i].data)


def test_a_group_of_other_formats_is_stacked():
    x = np.arange(16, dtype="<f4").reshape(2, 4, 2)
    spec = InputConfig(format="raw", shape=(4, 2))
    batch = codecs.decode_many([x[0].tobytes(), b"\0", x[1].tobytes()], spec)
    assert [i for i, _ in batch.decoded] == [0, 2] and np.array_equal(batch.x, x)
    assert [(i, e.code) for i, e in batch.errors] == [(1, "bad_shape")]
