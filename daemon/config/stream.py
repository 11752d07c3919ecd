"""The `input.stream` route key: windows made from messages that each carry a few samples, read
and checked (the windows themselves: daemon/pipeline/stream_window.py; the streams' state:
daemon/serve/streams.py).

The frozen section and its reader, like reuse.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Union

from daemon.config.reader import Reader

DEFAULT_MAX_STREAMS = 4096
DEFAULT_MAX_GAP_MS = 5000.0
# Formats whose payload has fields (the stream's key or seq may be read from them).
FIELD_FORMATS = ("json",)
# Formats a stream message may carry its samples in.
STREAM_FORMATS = ("json", "raw", "pcm16")


@dataclass(frozen=True)
class StreamConfig:
    key: Optional[Union[int, str]] = field(default=None, metadata={
        "doc_default": "the level the filter's first `+` matches; the whole topic without one",
        "doc_type": "integer or string"})
    """What names the device whose samples a message carries: an integer is a topic level (0 is the
    first), a string a field of a JSON message. Each device's samples make their own windows."""
    window: int = field(default=0, metadata={"doc_default": "`input.shape[0]`"})
    """Samples in a window: a route's `input.shape` is one window, its first axis the samples and
    the rest one sample's shape (`[50, 6]`: 50 samples of 6 values)."""
    hop: int = field(default=0, metadata={"doc_default": "`window`"})
    """A window is inferred every `hop` samples (smaller than `window`: windows overlap; larger:
    samples between windows are skipped)."""
    max_gap_ms: Optional[float] = DEFAULT_MAX_GAP_MS
    """A stream silent for longer than this starts its window again, and its next result says
    `gap: true`. null: silence never restarts a window."""
    max_streams: int = DEFAULT_MAX_STREAMS
    """Streams held at most, per route; past it the least recently heard is evicted (counted in
    `stream_evicted`; its partial window is lost, and its next result says `gap: true`)."""
    seq: Optional[str] = None
    """A JSON message's field that numbers its first sample (the rest follow on): a missing number
    restarts the window (a gap), a number already taken is dropped (a QoS 1 redelivery). null:
    samples are taken in arrival order, and results say their arrival times."""


def read_stream(r: Reader, m: Mapping, p: str, fmt: str, shape: tuple) -> Optional[StreamConfig]:
    """routes[i].input.stream, checked against the route's format and shape."""
    if "stream" not in m:
        return None
    p = f"{p}.stream"
    s = r.section(m, "stream", StreamConfig, path=p)
    if fmt not in STREAM_FORMATS:
        r.error(m, "stream", p.rsplit(".", 1)[0], f"applies to formats {', '.join(STREAM_FORMATS)}, not {fmt}")
    key = r.get(s, "key", p, (int, str, type(None)), None, check=_key_problem)
    seq = r.get(s, "seq", p, (str, type(None)), None)
    for name, value in (("key", key), ("seq", seq)):
        if isinstance(value, str) and fmt not in FIELD_FORMATS:
            r.error(s, name, p, f"a field of the message needs format json; format {fmt} has no fields")
    samples = shape[0] if shape else 0
    window = r.get(s, "window", p, int, samples, minimum=1)
    if shape and window != samples and r.ok(f"{p}.window"):
        r.error(s, "window", p, f"must equal input.shape[0] ({samples}): a window is one input of the model, "
                f"{list(shape)}")
    return StreamConfig(
        key=key,
        window=window,
        hop=r.get(s, "hop", p, int, window, minimum=1),
        max_gap_ms=r.get(s, "max_gap_ms", p, (int, float, type(None)), DEFAULT_MAX_GAP_MS, check=_positive_or_null),
        max_streams=r.get(s, "max_streams", p, int, DEFAULT_MAX_STREAMS, minimum=1),
        seq=seq,
    )


def _key_problem(value: object) -> Optional[str]:
    if isinstance(value, bool) or (isinstance(value, int) and value < 0):
        return f"must be a topic level (0 or more) or a JSON field name, got {value!r}"
    if isinstance(value, str) and not value:
        return "must name a JSON field"
    return None


def _positive_or_null(value: Optional[float]) -> Optional[str]:
    return f"must be > 0 or null, got {value!r}" if value is not None and not value > 0 else None
