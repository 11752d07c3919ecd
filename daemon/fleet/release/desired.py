"""Desired documents (docs/fleet.md, "Desired"): parsed, ordered by `rev`, and merged per model.

Pure: bytes in, frozen records out. A node reads its own document and one per group it is in;
per model the node's own wins, then the first group listed in `fleet.groups`. A document's
`rev` orders it against the one taken before from the same topic, so a retained document that
the broker hands out again (after a restart, a reconnect, a broker restart) changes nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

NODE = "node"
# A release URL longer than this is refused: it goes into every reported document.
MAX_URL_CHARS = 2048
_URL_SCHEMES = ("http://", "https://")


def group_source(group: str) -> str:
    return f"group/{group}"


@dataclass(frozen=True)
class Target:
    """One model's desired release: where it is and the serial the publisher expects there."""

    url: str
    serial: Optional[int]
    source: str
    """`node` or `group/<name>`: which document asked for it."""

    @property
    def manifest_url(self) -> str:
        return self.base_url + "manifest.json"

    @property
    def base_url(self) -> str:
        return self.url if self.url.endswith("/") else self.url + "/"

    def as_dict(self) -> dict:
        return {"url": self.url, "serial": self.serial, "source": self.source}


@dataclass(frozen=True)
class DesiredDoc:
    rev: int
    models: Mapping[str, Optional[Target]]
    """None: the document takes this model away from the groups below it (no opinion)."""


def parse_desired(payload: bytes, source: str) -> Optional[DesiredDoc]:
    """The document, or None for an empty payload (a retained document deleted). ValueError,
    with the reason in words, for anything else that is not a document."""
    if not payload:
        return None
    try:
        raw = json.loads(payload)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError("must be a JSON object with rev and models")
    rev = raw.get("rev")
    if not isinstance(rev, int) or isinstance(rev, bool) or rev < 0:
        raise ValueError(f"rev must be a non-negative integer, got {rev!r}")
    models = raw.get("models", {})
    if not isinstance(models, dict):
        raise ValueError("models must be an object of model name -> {url, serial}")
    return DesiredDoc(rev, {str(name): _target(name, entry, source) for name, entry in models.items()})


def _target(name: Any, entry: Any, source: str) -> Optional[Target]:
    if entry is None:
        return None
    if not isinstance(entry, dict):
        raise ValueError(f"models.{name} must be an object with url (and serial), or null")
    url, serial = entry.get("url"), entry.get("serial")
    if not isinstance(url, str) or not url.startswith(_URL_SCHEMES) or len(url) > MAX_URL_CHARS:
        raise ValueError(f"models.{name}.url must be an http:// or https:// URL, got {url!r}")
    if serial is not None and (not isinstance(serial, int) or isinstance(serial, bool) or serial < 0):
        raise ValueError(f"models.{name}.serial must be a non-negative integer, got {serial!r}")
    return Target(url, serial, source)


def merge(docs: Mapping[str, DesiredDoc], groups: Sequence[str]) -> dict[str, Target]:
    """Per model, the target that wins: the node's own document, then the groups in order. A model
    the node's document maps to null takes no group's target."""
    out: dict[str, Target] = {}
    silenced: set[str] = set()
    node = docs.get(NODE)
    if node is not None:
        for name, target in node.models.items():
            if target is None:
                silenced.add(name)
            else:
                out[name] = target
    for group in groups:
        doc = docs.get(group_source(group))
        if doc is None:
            continue
        for name, target in doc.models.items():
            if target is not None and name not in out and name not in silenced:
                out[name] = target
    return out


def newer(doc: DesiredDoc, taken_rev: Optional[int]) -> bool:
    """Whether `doc` changes what was taken from its topic: a higher rev. The same rev again is the
    broker replaying a retained document; a lower one is stale (a publisher that lost count)."""
    return taken_rev is None or doc.rev > taken_rev


def doc_as_dict(doc: DesiredDoc) -> dict:
    """For the node's own record on disk (the documents taken, so a restart need not wait for them)."""
    return {"rev": doc.rev, "models": {name: None if t is None else {"url": t.url, "serial": t.serial}
                                       for name, t in doc.models.items()}}
