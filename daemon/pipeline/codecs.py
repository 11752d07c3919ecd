"""Request bytes -> ndarray, and result/error -> reply bytes.

Every failure is a `PayloadError` with a contract code (`too_large`, `bad_payload`,
`bad_shape`) and the request's JSON id when it could be read, so the caller can always
answer. The size limit is checked before anything is parsed.
"""

from __future__ import annotations

import io
import itertools
import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, NamedTuple, Optional, Sequence

import numpy as np
import orjson

from daemon.config.schema import PCM16, InputConfig
from daemon.errors import BAD_PAYLOAD, BAD_SHAPE, TOO_LARGE, PayloadError
from daemon.pipeline import images, pcm16
from daemon.pipeline.geometry import Geometry

_NUMERIC_KINDS = "fiu"
# `scan_id` looks for the id only this far into a payload: it runs on paho's thread for
# shed requests and must stay O(1). Clients put the id first; a later one reads as null.
_ID_SCAN_BYTES = 256
_ID_PATTERN = re.compile(rb'"id"\s*:\s*("(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null)\s*[,}]')
_RAGGED = "data must be a (nested) list of numbers with equal-length rows"


@dataclass(slots=True)  # one per request: slotted, not frozen (see route_pipeline.Request); never assigned
class Decoded:
    request_id: Any
    data: np.ndarray  # float32 (an image's uint8 pixels), exactly the route's input shape
    timeout_ms: Optional[float] = None  # JSON requests may bound their own wait
    geometry: Optional[Geometry] = None  # an image: where the sent picture lies in the model's input


class DecodedBatch(NamedTuple):
    """What `decode_many` made of a group of payloads: the decoded ones stacked, the others' errors."""

    decoded: list[tuple[int, Decoded]]  # (position among the payloads, its request), in order
    x: np.ndarray  # their inputs, (len(decoded), *input.shape); row k is decoded[k]'s `data`
    errors: list[tuple[int, PayloadError]]  # (position, why), for the caller to answer each


class _Values(NamedTuple):
    """A request's numbers as orjson gave them: a flat list, or equal-length rows of the last level
    (chained by `np.fromiter`, never copied into a flat list in Python)."""

    rows: list
    nested: bool
    size: int

    def iterate(self) -> Iterable:
        return itertools.chain.from_iterable(self.rows) if self.nested else self.rows


NOT_FINITE = "data contains NaN or infinity, or values beyond float32"
_NOT_NUMBERS = "data must be a (nested) list of numbers"


def decode(payload: bytes, spec: InputConfig, check_finite: bool = True) -> Decoded:
    """Check size, parse by format, then check element count, shape and finiteness.

    `check_finite=False` leaves the finiteness check to a caller that checks a whole batch
    at once (`pipeline.handle_batch`): one vectorized pass instead of one per request."""
    check_size(payload, spec)
    timeout_ms = None
    request_id: Any = None
    if spec.format == "json":
        request_id, data, timeout_ms = _parse_json(payload)
        with np.errstate(over="ignore"):
            array = _to_array(_values(data, request_id), request_id)
    elif spec.format == "raw":
        array = _decode_raw(payload, spec)
    elif spec.format == "npy":
        array = _decode_npy(payload)
    elif spec.format == PCM16:
        array = pcm16.clip(payload, math.prod(spec.shape))
    else:
        array, geometry = _decode_image(payload, spec)
        return Decoded(None, array, None, geometry)  # uint8 pixels: finite, and copied no further here
    data = _conform(array, spec, request_id)
    if check_finite and not np.isfinite(data).all():
        raise PayloadError(BAD_PAYLOAD, NOT_FINITE, request_id)
    return Decoded(request_id, data, timeout_ms)


def decode_many(payloads: Sequence[bytes], spec: InputConfig) -> DecodedBatch:
    """A group of one route's payloads -> their inputs as one array, and an error for each bad one.

    JSON (the costly format) goes into one float32 array made for the group, one errstate and
    one reshape for all, each request's values converted by `np.fromiter` as soon as it is
    parsed (no per-request errstate, stack or reshape). Other formats decode one by one and
    are stacked. Finiteness is left to the caller, one pass for the batch."""
    if spec.format == "json":
        return _decode_json_many(payloads, spec)
    decoded: list[tuple[int, Decoded]] = []
    errors: list[tuple[int, PayloadError]] = []
    for i, payload in enumerate(payloads):
        try:
            decoded.append((i, decode(payload, spec, check_finite=False)))
        except PayloadError as exc:
            errors.append((i, exc))
    x = np.stack([d.data for _, d in decoded]) if decoded else np.empty((0, *spec.shape), np.float32)
    return DecodedBatch(decoded, x, errors)


def _decode_json_many(payloads: Sequence[bytes], spec: InputConfig) -> DecodedBatch:
    expected = math.prod(spec.shape)
    x = np.empty((len(payloads), expected), np.float32)
    good: list[tuple[int, Any, Optional[float]]] = []
    errors: list[tuple[int, PayloadError]] = []
    with np.errstate(over="ignore"):  # beyond float32 becomes inf: refused as bad_payload (not finite)
        for i, payload in enumerate(payloads):
            try:
                request_id, timeout_ms, x[len(good)] = _json_row(payload, spec, expected)
                good.append((i, request_id, timeout_ms))
            except PayloadError as exc:
                errors.append((i, exc))
    x = x[:len(good)].reshape(len(good), *spec.shape)
    return DecodedBatch([(i, Decoded(rid, x[k], t)) for k, (i, rid, t) in enumerate(good)], x, errors)


def _json_row(payload: bytes, spec: InputConfig, expected: int) -> tuple[Any, Optional[float], np.ndarray]:
    """One JSON request's id, timeout and values (float32, flat), converted at once so that the
    parsed lists die here: held for the whole group, they cost more in gen-0 collections than a
    group-wide conversion saves (decode_many)."""
    check_size(payload, spec)
    request_id, data, timeout_ms = _parse_json(payload)
    values = _values(data, request_id)
    array = _to_array(values, request_id)  # bad_payload before bad_shape, as a lone decode
    if values.size != expected:
        _conform(array, spec, request_id)  # raises bad_shape
    return request_id, timeout_ms, array


def parse_object(payload: bytes, spec: InputConfig) -> tuple[dict, Decoded]:
    """A JSON request within the size limit: the object, and its id, timeout and `data` as flat
    float32, not yet checked finite (a stream message's samples: daemon/pipeline/stream_codec.py)."""
    check_size(payload, spec)
    obj = _loads(payload)
    request_id, data, timeout_ms = _request_fields(obj)
    with np.errstate(over="ignore"):
        return obj, Decoded(request_id, _to_array(_values(data, request_id), request_id), timeout_ms)


def check_size(payload: bytes, spec: InputConfig) -> None:
    if len(payload) > spec.max_bytes:
        raise PayloadError(TOO_LARGE, f"payload is {len(payload)} bytes; the limit is {spec.max_bytes}")


def _parse_json(payload: bytes) -> tuple[Any, Any, Optional[float]]:
    """The request's id, its `data` as parsed, and its `timeout_ms`."""
    return _request_fields(_loads(payload))


def _request_fields(obj: Any) -> tuple[Any, Any, Optional[float]]:
    if not isinstance(obj, dict):
        raise PayloadError(BAD_PAYLOAD, 'expected a JSON object {"id": ..., "data": [...]}')
    request_id = obj.get("id")
    if "data" not in obj:
        raise PayloadError(BAD_PAYLOAD, 'the request has no "data"', request_id)
    timeout_ms = obj.get("timeout_ms")
    if timeout_ms is not None and (isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float))
                                   or not timeout_ms >= 0):
        raise PayloadError(BAD_PAYLOAD, "timeout_ms must be a non-negative number of milliseconds", request_id)
    return request_id, obj["data"], timeout_ms


def _loads(payload: bytes) -> Any:
    """orjson (5x json.loads); its depth limit (1024) turns deep nesting into bad_payload.

    An invalid document (NaN literals, say) still gets its id back when a scan finds one."""
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise PayloadError(BAD_PAYLOAD, f"not valid JSON: {exc}", _scan_json_id(payload)) from None


def _values(data: Any, request_id: Any) -> _Values:
    """A (nested) list of numbers -> its values, each level checked for equal-length rows.

    Levels above the last two are chained flat in Python; the last level's rows are left
    as they are for `np.fromiter` to chain: np.asarray on nested lists costs several times a
    flat list (PITFALLS: 39 vs 8 us on 150 values), and fromiter over chained rows beats a
    flat copy and np.array (150 x [v]: 8.3 vs 9.8 us; 100 x 6: 15.6 vs 20.2 us)."""
    if not isinstance(data, list):
        return _Values([data], False, 1)
    rows = data
    while rows and isinstance(rows[0], list):
        try:
            if len(set(map(len, rows))) != 1:
                raise PayloadError(BAD_SHAPE, _RAGGED, request_id)
        except TypeError:  # a number beside a list on the same level
            raise PayloadError(BAD_SHAPE, _RAGGED, request_id) from None
        if not rows[0] or not isinstance(rows[0][0], list):
            return _Values(rows, True, len(rows) * len(rows[0]))
        rows = list(itertools.chain.from_iterable(rows))
    return _Values(rows, False, len(rows))


def _to_array(values: _Values, request_id: Any) -> np.ndarray:
    """One request's values as a flat float32 array; bad_payload when one is not a number.

    The caller holds np.errstate(over="ignore"): values beyond float32 become inf, refused as
    bad_payload by the finite check."""
    try:
        return np.fromiter(values.iterate(), np.float32, values.size)
    except (ValueError, TypeError):
        raise PayloadError(BAD_PAYLOAD, _NOT_NUMBERS, request_id) from None


def _decode_raw(payload: bytes, spec: InputConfig) -> np.ndarray:
    dtype = np.dtype(spec.dtype).newbyteorder("<")
    expected = math.prod(spec.shape) * dtype.itemsize
    if len(payload) != expected:
        raise PayloadError(BAD_SHAPE, f"raw payload is {len(payload)} bytes; shape {list(spec.shape)} of "
                           f"{spec.dtype} needs {expected}")
    return np.frombuffer(payload, dtype=dtype)


def _decode_npy(payload: bytes) -> np.ndarray:
    try:
        array = np.load(io.BytesIO(payload), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise PayloadError(BAD_PAYLOAD, f"not a readable .npy array: {exc}") from None
    if not isinstance(array, np.ndarray) or array.dtype.kind not in _NUMERIC_KINDS:
        raise PayloadError(BAD_PAYLOAD, f"npy dtype {getattr(array, 'dtype', '?')} is not numeric")
    return array


def _decode_image(payload: bytes, spec: InputConfig) -> tuple[np.ndarray, Geometry]:
    """A JPEG or PNG of any size -> the route's [H, W, C] (or [H, W]) pixels, and where it lies."""
    height, width = spec.shape[:2]
    channels = spec.shape[2] if len(spec.shape) == 3 else 1
    pixels, geometry = images.decode_image(payload, height, width, channels, spec.resize, spec.max_pixels,
                                           draft=spec.decode == "fast")
    return pixels.reshape(spec.shape), geometry


def _conform(array: np.ndarray, spec: InputConfig, request_id: Any) -> np.ndarray:
    expected = math.prod(spec.shape)
    if array.size != expected:
        raise PayloadError(BAD_SHAPE, f"data has {array.size} values; shape {list(spec.shape)} needs {expected}",
                           request_id)
    if array.dtype != np.float32:
        with np.errstate(over="ignore"):  # values beyond float32 become inf here and are refused below
            array = array.astype(np.float32)
    return array.reshape(spec.shape)


def scan_id(payload: bytes, spec: InputConfig) -> Any:
    """Best-effort JSON id of a request that will not be decoded (shed on paho's thread).

    O(1): a regex over the first bytes, then orjson on the id alone. No full parse."""
    return _scan_json_id(payload) if spec.format == "json" else None


def _scan_json_id(payload: bytes) -> Any:
    found = _ID_PATTERN.search(payload, 0, _ID_SCAN_BYTES)
    if found is None:
        return None
    try:
        return orjson.loads(found.group(1))
    except orjson.JSONDecodeError:
        return None


def encode(reply: dict) -> bytes:
    """Compact JSON for results and errors (orjson: ~15x json.dumps).

    Copied into an exact-size object: orjson 3.13 returns a ~200-byte reply inside a ~4 KB
    allocation, and a reply lives until the broker acknowledges it (paho's queue, the outbox),
    so thousands in flight held 4 KB each (+393 MB of RSS per 100,000; copied: +24 MB)."""
    return bytes(memoryview(orjson.dumps(reply)))


def error_reply(request_id: Any, route: Optional[str], code: str, message: str) -> dict:
    return {"id": request_id, "route": route, "error": {"code": code, "message": message}}
