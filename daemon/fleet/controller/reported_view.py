"""Reading a node's reported document (docs/fleet.md, "Reported") for the controller: what a
model is doing in words, and whether it has settled on a rollout's serial (pure).

A node's document is another program's output: every field may be missing or of the wrong
type, and nothing here raises on that; it reads as "not yet".
"""

from __future__ import annotations

from typing import Optional

ACTIVE = "active"
FAILED = "failed"
ROLLED_BACK = "rolled_back"
DOWNLOADING = "downloading"
_PCT = 100


def model_entry(doc: Optional[dict], model: str) -> Optional[dict]:
    """The reported entry of `model`, or None when the node does not list it."""
    models = doc.get("models") if isinstance(doc, dict) else None
    entry = models.get(model) if isinstance(models, dict) else None
    return entry if isinstance(entry, dict) else None


def lists_model(doc: Optional[dict], model: str) -> bool:
    return model_entry(doc, model) is not None


def in_group(doc: Optional[dict], group: str) -> bool:
    groups = doc.get("groups") if isinstance(doc, dict) else None
    return isinstance(groups, list) and group in groups


def download_pct(entry: dict) -> Optional[int]:
    progress = entry.get("progress")
    if not isinstance(progress, dict):
        return None
    done, total = progress.get("bytes"), progress.get("total")
    if not isinstance(done, (int, float)) or not isinstance(total, (int, float)) or total <= 0:
        return None
    return int(done * _PCT // total)


def describe(entry: Optional[dict]) -> str:
    """`downloading 45%`, `active serial 4`, `failed gate: accuracy 0.51 < 0.97`, ... (one line)."""
    if entry is None:
        return "not reported"
    state = str(entry.get("state", "?"))
    if state == DOWNLOADING and download_pct(entry) is not None:
        return f"{state} {download_pct(entry)}%"
    if state == ACTIVE:
        return f"{state} serial {entry.get('serial', '?')}"
    code = error_code(entry)
    if code:
        error = entry.get("error")
        message = error.get("message") if isinstance(error, dict) else None
        return f"{state} {code}" + (f": {message}" if message else "")
    return state


def error_code(entry: Optional[dict]) -> Optional[str]:
    """The entry's error code; else `last: <code>` of the last refusal, but only while it is still
    the word on what the node was asked for: it names the target's serial and the node does not run
    it. A refusal older than that (a node active on a later release) is history, not its state."""
    error = entry.get("error") if isinstance(entry, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    if code:
        return str(code)
    rejected = entry.get("rejected") if isinstance(entry, dict) else None
    last = rejected[-1] if isinstance(rejected, list) and rejected and isinstance(rejected[-1], dict) else {}
    target = entry.get("target") if isinstance(entry, dict) else None
    wanted = target.get("serial") if isinstance(target, dict) else None
    current = wanted is not None and last.get("serial") == wanted and entry.get("serial") != wanted
    return f"last: {last['code']}" if current and last.get("code") else None


def verdict(entry: Optional[dict], serial: int) -> Optional[str]:
    """`active` once the model runs `serial`; `failed` or `rolled_back` once the node gave up on
    it (its target, or its rejected list, names `serial`); None while it is still on the way."""
    if entry is None:
        return None
    state = entry.get("state")
    if state == ACTIVE and entry.get("serial") == serial:
        return ACTIVE
    if state in (FAILED, ROLLED_BACK) and _concerns(entry, serial):
        return state
    return None


def _concerns(entry: dict, serial: int) -> bool:
    target = entry.get("target")
    if isinstance(target, dict) and target.get("serial") == serial:
        return True
    rejected = entry.get("rejected")
    return isinstance(rejected, list) and any(isinstance(r, dict) and r.get("serial") == serial for r in rejected)
