"""The node's side of the fleet's commands and documents: what was taken from each desired
topic (kept on disk), and the commands of docs/fleet.md ("Command") carried out.

`DocBook` keeps, per desired topic, the last document taken and its `rev` in
`<store_dir>/desired.json`, so a restart knows them before the broker hands the retained
documents out again, and a replayed one (the same rev) changes nothing.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Optional, Protocol

from daemon.fleet.release import desired
from daemon.fleet.node.durable import write_json
from daemon.fleet.release.refusal import OPERATOR, UNKNOWN_VERSION, Refused


class Agent(Protocol):
    """What a command needs of the agent (daemon/fleet/node/agent.py)."""

    records: dict
    stores: dict

    def targets(self) -> dict: ...
    def activate_staged(self, name: str) -> str: ...
    def rollback(self, name: str, code: str, message: str) -> str: ...

logger = logging.getLogger(__name__)

INSTALL, ROLLBACK, RETRY, CANCEL = "install", "rollback", "retry", "cancel"
COMMANDS = (INSTALL, ROLLBACK, RETRY, CANCEL)
DOCS_FILE = "desired.json"
# A command larger than this is not one.
MAX_COMMAND_BYTES = 4096


class DocBook:
    def __init__(self, store_dir: Path):
        self._path = Path(store_dir) / DOCS_FILE
        self.docs: dict[str, desired.DesiredDoc] = {}
        for source, raw in _read(self._path).items():
            try:
                doc = desired.parse_desired(json.dumps(raw).encode(), source)
            except ValueError:
                continue
            if doc is not None:
                self.docs[source] = doc

    def revs(self) -> dict:
        return {source: doc.rev for source, doc in sorted(self.docs.items())}

    def take(self, source: str, doc: Optional[desired.DesiredDoc]) -> list[str]:
        """Take `doc` from `source` when it is newer; the models whose target it changes."""
        old = self.docs.get(source)
        if doc is None:  # the retained document was deleted: what it asked for stays as it is
            return []
        if not desired.newer(doc, None if old is None else old.rev):
            if old is not None and doc.rev < old.rev:
                logger.warning("fleet: desired document on %s has rev %d, below the %d taken: ignored", source,
                               doc.rev, old.rev)
            return []
        self.docs[source] = doc
        self._path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_json(self._path, {s: desired.doc_as_dict(d) for s, d in self.docs.items()})
        before = {} if old is None else old.models
        return sorted(name for name in set(before) | set(doc.models) if before.get(name) != doc.models.get(name))


def peek(payload: bytes) -> Optional[dict]:
    """The command as a dict, or None when it is not one (for the MQTT thread's quick look)."""
    if len(payload) > MAX_COMMAND_BYTES:
        return None
    try:
        cmd = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return None
    return cmd if isinstance(cmd, dict) else None


def run(agent: Agent, payload: bytes) -> dict:
    """One command carried out on the agent's thread; the outcome for the reported doc's `last_cmd`."""
    cmd = peek(payload)
    if cmd is None:
        return {"cmd": None, "ok": False, "message": "not a command: expected {\"cmd\": ..., \"model\": ...}"}
    name, model = cmd.get("cmd"), cmd.get("model")
    outcome = {"cmd": name, "model": model}
    if name not in COMMANDS:
        return {**outcome, "ok": False, "message": f"unknown command {name!r} (known: {', '.join(COMMANDS)})"}
    if model not in agent.records:
        return {**outcome, "ok": False, "message": f"model {model!r} is not managed here "
                f"(managed: {', '.join(sorted(agent.records)) or 'none'})"}
    try:
        message = _carry_out(agent, name, model)
    except Refused as refusal:
        return {**outcome, "ok": False, "message": refusal.message}
    logger.info("fleet: command %s on %s: %s", name, model, message)
    return {**outcome, "ok": True, "message": message}


def _carry_out(agent: Agent, name: str, model: str) -> str:
    record = agent.records[model]
    if name == INSTALL:
        return agent.activate_staged(model)
    if name == ROLLBACK:
        return agent.rollback(model, OPERATOR, "rolled back by the operator")
    if name == RETRY:
        target = agent.targets().get(model)
        serial = None if target is None else target.serial
        record.forget(serial)
        record.error, record.state = None, "idle"
        return f"retrying serial {serial}" if serial is not None else "nothing desired to retry"
    record.staged = None  # CANCEL: the download stopped already (the MQTT thread set its flag)
    record.error, record.state = {"code": OPERATOR, "message": "cancelled by the operator"}, "failed"
    target = agent.targets().get(model)
    record.reject(None if target is None else target.serial, (record.target or {}).get("version") or UNKNOWN_VERSION,
                  OPERATOR, "cancelled by the operator")
    return "cancelled"


def _read(path: Path) -> dict:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}
