"""What a node knows of each managed model: its state, releases, figures and refusals.

One `ModelRecord` per managed model, owned by the agent's thread (daemon/fleet/node/agent.py):
kept on disk in the model's store (`state.json`, so a restart knows what it had refused and
where a canary was) and shown in the retained reported document (docs/fleet.md, "Reported").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

IDLE, DOWNLOADING, VERIFYING, GATING, STAGED, CANARY, ACTIVE, FAILED, ROLLED_BACK = (
    "idle", "downloading", "verifying", "gating", "staged", "canary", "active", "failed", "rolled_back")
STATES = (IDLE, DOWNLOADING, VERIFYING, GATING, STAGED, CANARY, ACTIVE, FAILED, ROLLED_BACK)
# Refusals remembered per model (the newest): enough to see a pattern, bounded for the retained doc.
MAX_REJECTED = 8
SHA_SHOWN = 12


@dataclass
class Release:
    """A release the node has: its serial, version and model sha256."""

    serial: int
    version: str
    sha256: str

    def as_dict(self) -> dict:
        return {"serial": self.serial, "version": self.version, "sha256": self.sha256[:SHA_SHOWN]}


@dataclass
class ModelRecord:
    model: str
    state: str = IDLE
    target: Optional[dict] = None  # {url, serial, source, version once the manifest is read}
    staged: Optional[int] = None  # a serial that passed the gate, waiting for `install` (activation: manual)
    summary: str = ""  # the target manifest's summary (Home Assistant's release notes)
    progress: Optional[dict] = None
    gate: Optional[dict] = None
    canary: Optional[dict] = None
    error: Optional[dict] = None
    rejected: list = field(default_factory=list)
    canary_serial: Optional[int] = None  # the release under canary, kept across restarts
    restarts: int = 0  # daemon starts during that canary

    def reject(self, serial: Optional[int], version: str, code: str, message: str) -> None:
        self.rejected = [r for r in self.rejected if r.get("serial") != serial]
        self.rejected.append({"serial": serial, "version": version, "code": code, "message": message})
        self.rejected = self.rejected[-MAX_REJECTED:]
        self.error = {"code": code, "message": message}

    def rejection(self, serial: Optional[int]) -> Optional[dict]:
        return next((r for r in self.rejected if r.get("serial") == serial), None)

    def refused(self) -> set[int]:
        """The serials refused here: never a rollback's destination (daemon/fleet/node/store.py: `below`)."""
        return {r["serial"] for r in self.rejected if isinstance(r.get("serial"), int)}

    def forget(self, serial: Optional[int], codes: Optional[tuple] = None) -> None:
        """Drop the refusal of `serial` (all of them, or only those with one of `codes`)."""
        self.rejected = [r for r in self.rejected if r.get("serial") != serial or
                         (codes is not None and r.get("code") not in codes)]

    def as_state(self) -> dict:
        """What state.json keeps (the figures of a step under way are not worth a write each)."""
        return {"state": self.state, "target": self.target, "staged": self.staged, "summary": self.summary,
                "gate": self.gate, "error": self.error, "rejected": self.rejected,
                "canary_serial": self.canary_serial, "restarts": self.restarts}

    @classmethod
    def from_state(cls, model: str, raw: dict) -> "ModelRecord":
        record = cls(model)
        for key in ("state", "target", "staged", "summary", "gate", "error", "canary_serial", "restarts"):
            if key in raw:
                setattr(record, key, raw[key])
        record.rejected = [r for r in raw.get("rejected", []) if isinstance(r, dict)][-MAX_REJECTED:]
        if record.state not in STATES:
            record.state = IDLE
        return record

    def as_report(self, current: Optional[Release], previous: Optional[Release]) -> dict:
        out: dict = {"state": self.state}
        out.update(current.as_dict() if current else {"version": None, "serial": None, "sha256": None})
        out["previous"] = previous.as_dict() if previous else None
        out["target"] = self.target
        for key in ("staged", "progress", "gate", "canary", "error"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        out["rejected"] = list(self.rejected)
        return out
