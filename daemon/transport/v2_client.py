"""One infer call to an Open Inference Protocol (KServe v2 REST) server: the `to_v2` far tier's client.

`encode_infer` and `decode_scores` are pure (bytes and arrays); `V2Client` holds one kept-alive
connection and is used by one thread at a time (daemon/serve/far_v2.py gives each sender its
own). The rows go as one tensor `[N, *row]` along the batch dimension, in JSON or with the
binary tensor extension (`Inference-Header-Content-Length`, `parameters.binary_data_size`).
Every failure (refused, reset, timed out, an HTTP error, a body that is not a v2 response of N
rows) raises `V2CallError` with a short reason; the caller falls back to the local answers.
"""

from __future__ import annotations

import http.client
import socket
import ssl
from typing import Optional
from urllib.parse import urlsplit

import numpy as np
import orjson

from daemon.config.escalate_v2 import V2TierConfig

HEADER_LENGTH = "Inference-Header-Content-Length"
EXCERPT = 200  # characters of an error body kept in the reason
NUMPY_OF = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64, "INT8": np.int8, "UINT8": np.uint8,
            "INT16": np.int16, "UINT16": np.uint16, "INT32": np.int32, "UINT32": np.uint32, "INT64": np.int64,
            "UINT64": np.uint64}
# A kept-alive connection the server closed while idle fails like this on its next request.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


class V2CallError(Exception):
    """An infer call that gave no usable scores; the message says why in one line."""


def encode_infer(tier: V2TierConfig, rows: np.ndarray, request_id: str) -> tuple[bytes, dict]:
    """The infer request's body and headers for `rows` (N, *row), real values."""
    data = np.ascontiguousarray(rows, dtype=NUMPY_OF[tier.input_datatype])
    tensor = {"name": tier.input_name, "shape": list(data.shape), "datatype": tier.input_datatype}
    request: dict = {"id": request_id, "inputs": [tensor]}
    output_params = {"binary_data": True} if tier.binary else {}
    if tier.output is not None:
        request["outputs"] = [{"name": tier.output, "parameters": output_params}]
    elif tier.binary:
        request["parameters"] = {"binary_data_output": True}
    headers = {"Content-Type": "application/json", **dict(tier.headers)}
    if tier.token is not None:
        headers["Authorization"] = f"Bearer {tier.token}"
    if not tier.binary:
        tensor["data"] = data.reshape(-1)
        return orjson.dumps(request, option=orjson.OPT_SERIALIZE_NUMPY), headers
    raw = data.astype(data.dtype.newbyteorder("<"), copy=False).tobytes()
    tensor["parameters"] = {"binary_data_size": len(raw)}
    head = orjson.dumps(request)
    headers["Content-Type"] = "application/octet-stream"
    headers[HEADER_LENGTH] = str(len(head))
    return head + raw, headers


def decode_scores(tier: V2TierConfig, body: bytes, header_length: Optional[str], n: int) -> tuple[np.ndarray, Optional[str]]:
    """(N, k) float32 scores from an infer response, and the model_version it names."""
    binary = b""
    if header_length is not None:
        try:
            cut = int(header_length)
        except ValueError:
            raise V2CallError(f"{HEADER_LENGTH} {header_length!r} is not a number") from None
        body, binary = body[:cut], body[cut:]
    try:
        response = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise V2CallError(f"the response is not JSON: {body[:EXCERPT]!r}") from None
    outputs = response.get("outputs") if isinstance(response, dict) else None
    if not isinstance(outputs, list) or not outputs:
        raise V2CallError(f"the response has no outputs: {body[:EXCERPT]!r}")
    wanted = _pick(outputs, tier.output)
    scores = _tensor(outputs, wanted, binary).astype(np.float32, copy=False)
    if scores.ndim == 0 or scores.shape[0] != n:
        raise V2CallError(f"output {outputs[wanted].get('name')!r} has shape {list(scores.shape)}, "
                          f"not {n} rows for the {n} rows sent")
    scores = scores.reshape(n, -1)
    if not np.isfinite(scores).all():
        raise V2CallError(f"output {outputs[wanted].get('name')!r} holds NaN or infinity")
    version = response.get("model_version")
    return scores, None if version is None else str(version)


def _pick(outputs: list, name: Optional[str]) -> int:
    if name is None:
        return 0
    for i, out in enumerate(outputs):
        if isinstance(out, dict) and out.get("name") == name:
            return i
    names = [out.get("name") for out in outputs if isinstance(out, dict)]
    raise V2CallError(f"the response has no output {name!r} (it has {names})")


def _tensor(outputs: list, index: int, binary: bytes) -> np.ndarray:
    """Output `index` as an array: its JSON `data`, or its part of the binary tail (outputs'
    binary parts follow the JSON in output order)."""
    offset = 0
    for i, out in enumerate(outputs):
        if not isinstance(out, dict):
            raise V2CallError(f"output {i} is not an object")
        size = (out.get("parameters") or {}).get("binary_data_size")
        dtype = NUMPY_OF.get(out.get("datatype"))
        shape = out.get("shape")
        if i == index and dtype is None:
            raise V2CallError(f"output {out.get('name')!r} has datatype {out.get('datatype')!r}, not a number")
        if i == index:
            try:
                if size is None:
                    return np.asarray(out.get("data"), dtype=dtype).reshape(shape)
                part = binary[offset:offset + int(size)]
                return np.frombuffer(part, dtype=np.dtype(dtype).newbyteorder("<")).reshape(shape)
            except (TypeError, ValueError) as exc:
                raise V2CallError(f"output {out.get('name')!r} does not hold shape {shape}: {exc}") from None
        offset += int(size or 0)
    raise V2CallError(f"no output {index}")  # _pick returned an index of `outputs`: not reached


class V2Client:
    """One kept-alive connection to the server; a dropped one is opened again on the next call."""

    def __init__(self, tier: V2TierConfig):
        self._tier = tier
        parts = urlsplit(tier.url)
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port or (443 if self._https else 80)
        self._context = ssl.create_default_context(cafile=tier.ca_file) if self._https else None
        self._conn: Optional[http.client.HTTPConnection] = None
        self._ids = 0

    def infer(self, rows: np.ndarray, timeout_s: float) -> tuple[np.ndarray, Optional[str]]:
        """Scores for the rows, each socket operation within `timeout_s` (the caller's deadline
        holds anyway: daemon/serve/parking.py answers locally when it passes)."""
        self._ids += 1
        body, headers = encode_infer(self._tier, rows, str(self._ids))
        for attempt in range(2):
            reused = self._conn is not None
            try:
                return self._call(body, headers, len(rows), timeout_s)
            except _STALE as exc:
                self.close()
                if not reused or attempt:  # an idle kept-alive connection dropped: once more, fresh
                    raise V2CallError(_reason(exc)) from None
            except V2CallError:
                self.close()
                raise
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                raise V2CallError(_reason(exc)) from None
        raise V2CallError("not reached")  # the loop returns or raises

    def _call(self, body: bytes, headers: dict, n: int, timeout_s: float) -> tuple[np.ndarray, Optional[str]]:
        conn = self._connection(timeout_s)
        conn.request("POST", self._tier.infer_path, body, headers)
        response = conn.getresponse()
        data = response.read()
        if response.will_close:
            self.close()
        if response.status != 200:
            raise V2CallError(f"HTTP {response.status}: {_error_text(data)}")
        return decode_scores(self._tier, data, response.getheader(HEADER_LENGTH), n)

    def _connection(self, timeout_s: float) -> http.client.HTTPConnection:
        if self._conn is None:
            if self._https:
                conn = http.client.HTTPSConnection(self._host, self._port, timeout=timeout_s, context=self._context)
            else:
                conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout_s)
            conn.connect()
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._conn = conn
        self._conn.sock.settimeout(timeout_s)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _error_text(data: bytes) -> str:
    """A v2 error body's `error`, else the body's start (MLServer answers a model's exception in plain text)."""
    try:
        found = orjson.loads(data)
        if isinstance(found, dict) and "error" in found:
            return str(found["error"])[:EXCERPT]
    except orjson.JSONDecodeError:
        pass
    return data[:EXCERPT].decode("utf-8", "replace")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "timed out"
    return f"{type(exc).__name__}: {exc}"
