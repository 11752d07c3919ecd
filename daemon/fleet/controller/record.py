"""The rollout record, retained on `edge-inferd/fleet/rollout/<model>` (docs/fleet.md): what a
controller killed mid-rollout starts again from, and what `fleet abort` changes.

The fields are the Protocol's; `previous` is an addition: each assigned node's desired entry for
the model before the rollout changed it, which `on_abort: rollback` restores: null when the node's
document had no entry (the key is removed again), EXPLICIT_NULL when the entry was `null` (no
opinion, which takes a group's entry away: restored as `null`, not removed).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Mapping, Optional

import orjson

TOPIC_PREFIX = "edge-inferd/fleet/rollout/"
RUNNING = "running"
ABORTING = "aborting"  # asked for (by `fleet abort`); the controller applies on_abort, then:
ABORTED = "aborted"
COMPLETED = "completed"
STATES = (RUNNING, ABORTING, ABORTED, COMPLETED)
LIVE = (RUNNING, ABORTING)  # a controller has (or should have) work left
ROLLBACK = "rollback"
HALT = "halt"
ON_ABORT = (ROLLBACK, HALT)
# What a node's wave ended in (`result`): its reported state, or no answer within the wave timeout.
TIMEOUT = "timeout"
EXPLICIT_NULL = {"null": True}


def topic(model: str) -> str:
    return TOPIC_PREFIX + model


@dataclass(frozen=True)
class RolloutRecord:
    model: str
    release: str
    """The release directory's URL, as the desired entries carry it."""
    serial: int
    version: Optional[str]
    """For people only: nodes learn the version from the signed manifest."""
    waves: tuple[str, ...]
    """The specs as given (`1`, `10%`, a node name): the plan is computed again from them and `nodes`."""
    nodes: tuple[str, ...]
    """Every node of the rollout, in wave order, fixed when it started."""
    state: str
    success: float
    """A wave passes when active / wave nodes reaches this."""
    abort_at: float
    """`--abort-at`: abort once failed / judged reaches this (and `min_nodes` have failed)."""
    min_nodes: int
    wave_timeout_s: float
    on_abort: str
    wave: int = 0
    """The wave being rolled out (0-based)."""
    assigned: Mapping[str, int] = field(default_factory=dict)
    """node -> the wave that assigned it; written before its desired document, so a restart never assigns twice."""
    revs: Mapping[str, int] = field(default_factory=dict)
    """node -> the `rev` of the last desired document this rollout wrote for it."""
    result: Mapping[str, str] = field(default_factory=dict)
    """node -> active, failed, rolled_back or timeout, once judged."""
    previous: Mapping[str, Optional[dict]] = field(default_factory=dict)

    def same_release(self, release: str, serial: int) -> bool:
        return _norm(self.release) == _norm(release) and self.serial == serial

    def entry(self) -> dict:
        """The desired entry this rollout writes for its model."""
        return {"url": self.release, "serial": self.serial}

    def change(self, **changes) -> "RolloutRecord":
        return dataclasses.replace(self, **changes)

    def to_json(self) -> bytes:
        doc = dataclasses.asdict(self)
        doc["waves"], doc["nodes"] = list(self.waves), list(self.nodes)
        return orjson.dumps(doc)

    @classmethod
    def from_json(cls, payload: bytes) -> Optional["RolloutRecord"]:
        """The record, or None when the payload is not one (empty: cleared; another tool's shape)."""
        try:
            doc = orjson.loads(payload)
            known = {f.name for f in dataclasses.fields(cls)}
            record = cls(**{k: v for k, v in doc.items() if k in known})
        except (orjson.JSONDecodeError, TypeError, AttributeError):
            return None
        if not isinstance(record.serial, int) or record.state not in STATES:
            return None
        return record.change(waves=tuple(record.waves), nodes=tuple(record.nodes))


def _norm(url: str) -> str:
    """`url` is the release directory "with or without the trailing /" (docs/fleet.md)."""
    return url.rstrip("/")
