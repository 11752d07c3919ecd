"""One release from its URL to a whole release in the store, and through the gate.

The order is the protocol's (docs/fleet.md), as the reported states show it (`verifying`,
`downloading`, `verifying`, `gating`), and every step before the last leaves the store as it
was, so the running release serves throughout: the manifest and its signatures (at least
`fleet.threshold` pinned keys); the serial against the committed one; the model's interface
against every route that uses it, all before a byte of the model is fetched; then the size
against the cap and the free disk; the files, resumable, each streamed through sha256, fsynced
and renamed into the store (daemon/fleet/node/fetch.py, store.py); each file read back against its
signed sha256 before the release is admitted; last the gate on this node's own data, in a
child process (gate.py).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from daemon.config.check import interface_problems
from daemon.config.schema import Config
from daemon.fleet.node import gate
from daemon.fleet.release.desired import Target
from daemon.fleet.node.fetch import FetchPolicy, fetch_file, fetch_small
from daemon.fleet.node.part import hash_file
from daemon.fleet.release.refusal import (DOWNGRADE, INTERFACE, NO_SPACE, SERIAL_MISMATCH, SHA256_MISMATCH, TOO_LARGE,
                                  WRONG_MODEL, Refused)
from daemon.fleet.release.release import Manifest, verify_manifest
from daemon.fleet.node.store import ModelStore

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
SIGNATURE = "manifest.json.minisig"
# A manifest or a signature file larger than this is not one.
MAX_MANIFEST_BYTES = 1 << 20
MAX_SIGNATURE_BYTES = 64 << 10


@dataclass(frozen=True)
class Installer:
    """What installing needs: the running config, the trusted keys, the fetch policy, the store."""

    config: Config
    trusted: Sequence  # minisign.PublicKey
    policy: FetchPolicy
    store: ModelStore
    set_state: Callable[..., None]
    """(state, **fields): the agent's record and reported doc follow each step."""
    cancel: threading.Event

    @property
    def model(self) -> str:
        return self.store.model

    def signed(self, target: Target) -> tuple[bytes, str]:
        """The target's manifest and its signatures, as the server sent them (nothing verified yet)."""
        data = fetch_small(target.manifest_url, MAX_MANIFEST_BYTES, self.policy)
        signatures = fetch_small(target.base_url + SIGNATURE, MAX_SIGNATURE_BYTES, self.policy).decode("utf-8",
                                                                                                      "replace")
        return data, signatures

    def manifest(self, target: Target, data: bytes, signatures: str) -> Manifest:
        """The manifest, verified and checked against this node; nothing fetched beyond it."""
        fleet = self.config.fleet
        manifest = verify_manifest(data, signatures, self.trusted, fleet.threshold)
        if manifest.model != self.model:
            raise Refused(WRONG_MODEL, f"the release is of model {manifest.model!r}, not {self.model!r}")
        if target.serial is not None and target.serial != manifest.serial:
            raise Refused(SERIAL_MISMATCH, f"the desired document says serial {target.serial}; the signed manifest "
                          f"at {target.manifest_url} says {manifest.serial}")
        committed = self.store.current()
        kept = manifest.serial in self.store.kept()
        if committed is not None and manifest.serial < committed and not kept and not fleet.allow_downgrade:
            raise Refused(DOWNGRADE, f"serial {manifest.serial} is below the committed {committed} and not kept here "
                          "(fleet.allow_downgrade is false)")
        problems = interface_problems(self.config, self.model, manifest.interface)
        if problems:
            raise Refused(INTERFACE, "; ".join(problems))
        return manifest

    def fetch(self, target: Target, manifest: Manifest, data: bytes, signatures: str) -> None:
        """The release's files into the store (a kept release: nothing to fetch)."""
        if manifest.serial in self.store.kept():
            return
        total = sum(f.size for f in manifest.files)
        if total > self.config.fleet.fetch_max_bytes:
            raise Refused(TOO_LARGE, f"the release's files add up to {total} bytes, over fleet.fetch.max_mb "
                          f"({self.config.fleet.fetch.max_mb:g} MiB)")
        if self.store.free_bytes() < total + self.config.fleet.min_free_bytes:
            raise Refused(NO_SPACE, f"{total} bytes would leave less than fleet.fetch.min_free_mb "
                          f"({self.config.fleet.fetch.min_free_mb:g} MiB) free in {self.store.root}", final=False)
        incoming = self.store.incoming(manifest.serial)
        done = 0
        for entry in manifest.files:
            progress = _progress(self.set_state, done, total)
            self.set_state("downloading", progress={"bytes": done, "total": total, "file": entry.name})
            fetch_file(target.base_url + entry.name, incoming / entry.name, entry.size, entry.sha256, self.policy,
                       progress=progress, cancel=self.cancel)
            done += entry.size
        self.set_state("verifying", progress={"bytes": total, "total": total})
        check_digests(incoming, manifest)
        (incoming / MANIFEST).write_bytes(data)
        (incoming / SIGNATURE).write_text(signatures, encoding="utf-8")
        self.store.admit(manifest.serial)

    def gate(self, manifest: Manifest) -> dict:
        """The gate's figures; Refused when the release does worse here than the running one."""
        self.set_state("gating")
        release_dir = self.store.release_dir(manifest.serial)
        report, cpu_s = gate.measure(self.config.source, self.model, release_dir, self.config.fleet.gate.timeout_s)
        claims = [{"validate_sha256": c.validate_sha256, "metric": c.metric, "value": c.value} for c in manifest.claims]
        figures = gate.judge(report, claims, self.config.fleet.gate)
        figures["cpu_s"] = round(cpu_s, 3)
        note = gate.gated_routes(report)
        if note:
            figures["note"] = note
        logger.info("fleet: %s serial %d passed the gate (%s; %.2f s CPU)", self.model, manifest.serial,
                    ", ".join(f"{r} {f['metric']} {f['value']:.4f}" for r, f in report.items()) or "not measured",
                    cpu_s)
        return figures


def check_digests(incoming: Path, manifest: Manifest) -> None:
    """Each file read back from the store against the signed sha256, once all are there: the last
    look at the bytes before they become a release (a file kept from an earlier run, or changed on
    the card since its download, is caught here). A mismatch removes the file: a `retry` fetches it."""
    for entry in manifest.files:
        path = incoming / entry.name
        digest = hash_file(path).hexdigest()
        if digest != entry.sha256:
            path.unlink()
            raise Refused(SHA256_MISMATCH, f"{entry.name} read back from the store has sha256 {digest[:12]}, not "
                          f"the signed {entry.sha256[:12]}: its bytes changed on disk after the download")


def _progress(set_state: Callable[..., None], before: int, total: int) -> Callable[[int, int], None]:
    def progress(done: int, _size: int) -> None:
        set_state("downloading", progress={"bytes": before + done, "total": total})
    return progress
