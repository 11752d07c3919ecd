"""A stream message's bytes -> its samples, its seq and the stream it belongs to.

A message carries one or more whole samples (a sample is `input.shape[1:]`):
- json: `{"id": ..., "seq": 17, "data": [...]}`, `data` one sample or a list of them (any nesting
  whose values count a whole number of samples), `seq` (when `stream.seq` names it) the first
  sample's number;
- raw: the bytes of whole samples in `input.dtype`, little-endian;
- pcm16: little-endian int16 mono, one value a sample, scaled to [-1, 1) (daemon/pipeline/pcm16.py).
Every failure is a PayloadError with the message's id when it could be read, as codecs.py's.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional

import numpy as np

from daemon.config.schema import InputConfig
from daemon.errors import BAD_PAYLOAD, BAD_SHAPE, PayloadError
from daemon.pipeline import codecs, pcm16


class Samples(NamedTuple):
    samples: np.ndarray
    """(k, *sample shape) float32, finite."""
    seq: Optional[int]
    request_id: Any
    timeout_ms: Optional[float]
    field_key: Optional[str]
    """The stream's name read from the message (`stream.key` a field), else None."""


def decode_samples(payload: bytes, spec: InputConfig) -> Samples:
    sample_shape = spec.shape[1:]
    if spec.format == "json":
        obj, decoded = codecs.parse_object(payload, spec)
        samples = _whole(decoded.data, sample_shape, decoded.request_id)
        stream = spec.stream
        seq = _seq(obj, stream.seq, decoded.request_id) if stream.seq else None
        key = _field_key(obj, stream.key, decoded.request_id) if isinstance(stream.key, str) else None
        return Samples(samples, seq, decoded.request_id, decoded.timeout_ms, key)
    codecs.check_size(payload, spec)
    if spec.format == "pcm16":
        values = pcm16.samples(payload)
    else:
        dtype = np.dtype(spec.dtype).newbyteorder("<")
        if len(payload) % dtype.itemsize:
            raise PayloadError(BAD_SHAPE, f"a {len(payload)}-byte payload is not a whole number of {spec.dtype} "
                               "values")
        values = np.frombuffer(payload, dtype=dtype).astype(np.float32)
    return Samples(_whole(values, sample_shape, None), None, None, None, None)


def _whole(values: np.ndarray, sample_shape: tuple, request_id: Any) -> np.ndarray:
    """Flat values -> (k, *sample_shape), k >= 1, every value finite."""
    size = math.prod(sample_shape)
    if values.size == 0 or values.size % size:
        raise PayloadError(BAD_SHAPE, f"data has {values.size} values: a stream message carries whole samples of "
                           f"{list(sample_shape) or 'one value'} ({size} values each)", request_id)
    if not np.isfinite(values).all():
        raise PayloadError(BAD_PAYLOAD, codecs.NOT_FINITE, request_id)
    return values.reshape(-1, *sample_shape)


def _seq(obj: dict, name: str, request_id: Any) -> int:
    seq = obj.get(name)
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        raise PayloadError(BAD_PAYLOAD, f"{name!r} must number the message's first sample (an integer >= 0; "
                           f"input.stream.seq), got {seq!r}", request_id)
    return seq


def _field_key(obj: dict, name: str, request_id: Any) -> str:
    key = obj.get(name)
    if isinstance(key, bool) or not isinstance(key, (str, int)) or key == "":
        raise PayloadError(BAD_PAYLOAD, f"{name!r} must name the message's stream (a string or an integer; "
                           f"input.stream.key), got {key!r}", request_id)
    return str(key)
