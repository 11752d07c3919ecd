"""The `reuse` route key: the per-device fast path's settings (daemon/pipeline/reuse.py), read and checked.

The frozen section and its reader, like escalate.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

from daemon.config.reader import Reader

DEFAULT_REUSE_DEVICES = 10_000


@dataclass(frozen=True)
class ReuseConfig:
    max_change: float = field(default=0.0, metadata={"doc_default": "required"})
    """Largest absolute difference, element by element, between a device's input and the input of
    its last inferred request for that result to be reused; in the model's float input units (after
    `preprocess`, before INT8 quantization)."""
    max_age_s: float = field(default=0.0, metadata={"doc_default": "required"})
    """A result older than this (seconds since its inference) is never reused."""
    devices: int = DEFAULT_REUSE_DEVICES
    """Devices (request topics) remembered at most, least recently seen forgotten first."""


def read_reuse(r: Reader, m: Mapping, p: str) -> Optional[ReuseConfig]:
    if "reuse" not in m:
        return None
    s = r.section(m, "reuse", ReuseConfig, path=f"{p}.reuse")
    return ReuseConfig(
        max_change=r.get(s, "max_change", f"{p}.reuse", float, 0.0, minimum=0, required=True),
        max_age_s=r.get(s, "max_age_s", f"{p}.reuse", float, 0.0, minimum=0, required=True),
        devices=r.get(s, "devices", f"{p}.reuse", int, DEFAULT_REUSE_DEVICES, minimum=1),
    )
