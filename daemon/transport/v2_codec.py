"""The Open Inference Protocol's JSON (KServe v2 REST) to and from a route's own payloads.

Pure: bytes and dicts in, bytes and dicts out. A v2 infer request carries one input tensor of
the route's shape, with or without a leading batch dimension (`[N, *shape]`); each of its N rows
becomes one request payload in the route's format (json, raw or npy), so it is served exactly
as the same row sent over MQTT. The N replies become one v2 response, outputs by the route's
output kind. Anything malformed raises `V2Error` (a 400 with its code), before any serving.
"""

from __future__ import annotations

import io
import math
from typing import Any, NamedTuple, Optional, Sequence

import numpy as np
import orjson

from daemon.config.schema import ANOMALY, CLASSIFY, DETECT, PCM16, VALUES, RouteConfig

# v2 datatypes and the numpy types their JSON numbers are read as.
NUMPY_OF = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
            "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
            "FP16": np.float16, "FP32": np.float32, "FP64": np.float64}
# A route's `input.dtype` as a v2 datatype.
DATATYPE_OF = {"float32": "FP32", "float64": "FP64", "int8": "INT8", "uint8": "UINT8", "int16": "INT16",
               "uint16": "UINT16", "int32": "INT32"}
NUMERIC = tuple(t for t in NUMPY_OF if t != "BOOL")
BAD_REQUEST = "bad_request"  # the v2 body itself is wrong (the reply codes are daemon/errors.py's)
INPUT_NAME = "input"  # the one input every route has, in model metadata
# Rows of one v2 request at most: each becomes a queued request.
MAX_ROWS = 1024


class V2Error(ValueError):
    """A v2 request that cannot be served as sent: 400 with this code and message."""

    def __init__(self, message: str, code: str = BAD_REQUEST, request_id: Any = None):
        super().__init__(message)
        self.code = code
        self.request_id = request_id


def route_datatype(route: RouteConfig) -> str:
    """The datatype model metadata names: an image route takes UINT8 pixels, a json one FP32."""
    if route.input.format == "image":
        return "UINT8"
    if route.input.format == "json":
        return "FP32"
    return DATATYPE_OF[route.input.dtype]


class Infer(NamedTuple):
    request_id: Any
    payloads: list  # one per row, in the route's own format
    outputs: Optional[tuple]  # the output names asked for; None: all of them


def parse_infer(body: bytes, route: RouteConfig, header_length: Optional[int] = None) -> Infer:
    """A v2 infer request for `route`. `header_length` (the `Inference-Header-Content-Length`
    header): the binary tensor extension, the JSON being the body's first bytes and the tensor's
    data (`parameters.binary_data_size`) the rest, as tritonclient sends it by default."""
    binary = b""
    if header_length is not None:
        if not 0 <= header_length <= len(body):
            raise V2Error(f"Inference-Header-Content-Length {header_length} is past the body's {len(body)} bytes")
        body, binary = body[:header_length], body[header_length:]
    try:
        request = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise V2Error(f"the body is not JSON: {exc}") from None
    if not isinstance(request, dict):
        raise V2Error("the body must be a JSON object with \"inputs\"")
    request_id = request.get("id")
    if route.input.format == "image":
        raise V2Error(f"route {route.name!r} takes pictures: POST the JPEG or PNG bytes to /routes/{route.name}",
                      request_id=request_id)
    inputs = request.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise V2Error("\"inputs\" must be a list of exactly one tensor", request_id=request_id)
    rows = _rows(inputs[0], route, request_id, binary)
    return Infer(request_id, [_payload(row, route, request_id, len(rows)) for row in rows],
                 _asked(request.get("outputs"), route, request_id))


def _asked(outputs: Any, route: RouteConfig, request_id: Any) -> Optional[tuple]:
    """The names in the request's "outputs" (each must be one the route answers), or None: all."""
    if outputs is None:
        return None
    if not isinstance(outputs, list) or not all(isinstance(o, dict) and isinstance(o.get("name"), str)
                                                 for o in outputs):
        raise V2Error("\"outputs\" must be a list of {\"name\": ...}", request_id=request_id)
    names = tuple(o["name"] for o in outputs)
    known = {o["name"] for o in model_metadata(route, "")["outputs"]}
    unknown = [n for n in names if n not in known] if known else []
    if unknown:
        raise V2Error(f"route {route.name!r} has no output {unknown[0]!r} (it has: {', '.join(sorted(known))})",
                      request_id=request_id)
    return names


def _rows(tensor: dict, route: RouteConfig, request_id: Any, binary: bytes) -> np.ndarray:
    """The tensor's data as (N, *route shape), in the numpy type of its datatype."""
    shape, datatype, data = tensor.get("shape"), tensor.get("datatype"), tensor.get("data")
    want = tuple(route.input.shape)
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in shape):
        raise V2Error("the input's \"shape\" must be a list of non-negative integers", request_id=request_id)
    if tuple(shape) == want:
        n = 1
    elif len(shape) == len(want) + 1 and tuple(shape[1:]) == want and 1 <= shape[0] <= MAX_ROWS:
        n = shape[0]
    else:
        raise V2Error(f"route {route.name!r} takes shape {list(want)} or [N, {', '.join(map(str, want))}] "
                      f"(N 1..{MAX_ROWS}), got {shape}", code="bad_shape", request_id=request_id)
    allowed = NUMERIC if route.input.format == "json" else (DATATYPE_OF[route.input.dtype],)
    if datatype not in allowed:
        raise V2Error(f"route {route.name!r} takes datatype {' or '.join(allowed) if len(allowed) < 3 else 'FP32'}"
                      f", got {datatype!r}", request_id=request_id)
    array = _binary(tensor, datatype, binary, request_id) if binary else _listed(data, datatype, request_id)
    if array.size != n * math.prod(want):
        raise V2Error(f"the input's \"data\" hold {array.size} values; shape {shape} takes {n * math.prod(want)}",
                      code="bad_shape", request_id=request_id)
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        raise V2Error("the input's \"data\" must be finite numbers", request_id=request_id)
    return array.reshape((n, *want))


def _listed(data: Any, datatype: str, request_id: Any) -> np.ndarray:
    if not isinstance(data, list):
        raise V2Error("the input's \"data\" must be a list of numbers (flat or nested)", request_id=request_id)
    try:
        return np.asarray(data, dtype=NUMPY_OF[datatype])
    except (ValueError, TypeError, OverflowError) as exc:
        raise V2Error(f"the input's \"data\" are not {datatype} numbers in a regular shape: {exc}",
                      request_id=request_id) from None


def _binary(tensor: dict, datatype: str, binary: bytes, request_id: Any) -> np.ndarray:
    """The binary extension: the tensor's bytes, little-endian, all that follows the JSON."""
    size = (tensor.get("parameters") or {}).get("binary_data_size")
    if size != len(binary):
        raise V2Error(f"binary_data_size must be the {len(binary)} bytes after the JSON header, got {size!r}",
                      request_id=request_id)
    itemsize = np.dtype(NUMPY_OF[datatype]).itemsize
    if len(binary) % itemsize:
        raise V2Error(f"{len(binary)} bytes are not whole {datatype} values", code="bad_shape",
                      request_id=request_id)
    return np.frombuffer(binary, dtype=np.dtype(NUMPY_OF[datatype]).newbyteorder("<"))


def _payload(row: np.ndarray, route: RouteConfig, request_id: Any, n: int) -> bytes:
    """One row as the route's own payload: what an MQTT device would have sent."""
    fmt = route.input.format
    if fmt == "json":
        body = {"data": row.astype(np.float64).ravel().tolist()}
        if n == 1 and request_id is not None:
            body["id"] = request_id
        return orjson.dumps(body)
    little = row.astype(np.dtype(route.input.dtype).newbyteorder("<"))
    if fmt in ("raw", PCM16):  # pcm16: the int16 samples themselves
        return little.tobytes()
    out = io.BytesIO()
    np.save(out, little, allow_pickle=False)
    return out.getvalue()


def _tensor(name: str, datatype: str, shape: Sequence[int], data: list) -> dict:
    return {"name": name, "datatype": datatype, "shape": list(shape), "data": data}


def infer_response(route: RouteConfig, request_id: Any, replies: Sequence[dict],
                   asked: Optional[tuple] = None) -> dict:
    """The v2 response to N results (no errors among them), outputs by the route's kind (those
    `asked` for, in that order, when the request named some)."""
    first = replies[0]
    outputs = _outputs(route, replies)
    if asked:
        by_name = {o["name"]: o for o in outputs}
        outputs = [by_name[name] for name in asked if name in by_name]
    out: dict = {"model_name": route.name, "model_version": first.get("model_sha256", ""),
                 "outputs": outputs,
                 "parameters": {"cached": [bool(r.get("cached")) for r in replies]}}
    if request_id is not None:
        out["id"] = request_id if isinstance(request_id, str) else orjson.dumps(request_id).decode()
    return out


def _outputs(route: RouteConfig, replies: Sequence[dict]) -> list[dict]:
    n = len(replies)
    if route.kind == CLASSIFY:
        k = min(len(r.get("top_k") or ()) for r in replies)
        return [_tensor("label", "BYTES", [n], [r["label"] for r in replies]),
                _tensor("index", "INT32", [n], [int(r["index"]) for r in replies]),
                _tensor("scores", "FP32", [n, k], [float(t["score"]) for r in replies for t in r["top_k"][:k]]),
                _tensor("labels", "BYTES", [n, k], [t["label"] for r in replies for t in r["top_k"][:k]])]
    if route.kind == ANOMALY:
        outputs = [_tensor("anomaly_score", "FP32", [n], [float(r["anomaly_score"]) for r in replies])]
        if all("anomaly" in r for r in replies):
            outputs.append(_tensor("anomaly", "BOOL", [n], [bool(r["anomaly"]) for r in replies]))
        return outputs
    if route.kind == VALUES:
        names = list(replies[0].get("values") or {})
        return [_tensor(name, "FP32", [n, len(np.ravel(replies[0]["values"][name]))],
                        [float(v) for r in replies for v in np.ravel(r["values"][name])]) for name in names]
    if route.kind == DETECT:  # ragged per row: one JSON string per row, as a BYTES tensor
        return [_tensor("detections", "BYTES", [n], [orjson.dumps(r["detections"]).decode() for r in replies])]
    return []


def model_metadata(route: RouteConfig, version: str) -> dict:
    """`GET /v2/models/<route>`: the route as a v2 model, its version the model's sha256 prefix."""
    shape = [-1, *route.input.shape]
    if route.kind == CLASSIFY:
        outputs = [("label", "BYTES", [-1]), ("index", "INT32", [-1]), ("scores", "FP32", [-1, route.top_k]),
                   ("labels", "BYTES", [-1, route.top_k])]
    elif route.kind == ANOMALY:
        outputs = [("anomaly_score", "FP32", [-1])] + ([("anomaly", "BOOL", [-1])] if route.threshold is not None
                                                       else [])
    elif route.kind == DETECT:
        outputs = [("detections", "BYTES", [-1])]
    else:
        outputs = []  # `values`: the model's own output names, known once it answers
    return {"name": route.name, "versions": [version] if version else [], "platform": "edge-inferd_tflite",
            "inputs": [{"name": INPUT_NAME, "datatype": route_datatype(route), "shape": shape}],
            "outputs": [{"name": name, "datatype": dt, "shape": s} for name, dt, s in outputs]}


def error_body(message: str, code: str, request_id: Optional[Any] = None) -> bytes:
    """Every error the listener answers: `{"error", "code", "id"}` (v2 clients read "error")."""
    return orjson.dumps({"error": message, "code": code, "id": request_id})
