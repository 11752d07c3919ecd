"""The operator's side of a release (`edge-inferd fleet sign`): copy the files into a release directory,
read the model's interface, write manifest.json and its signature; add further signatures for
`fleet.threshold` above 1. A node's side is daemon/fleet/release/release.py.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Optional, Sequence

from daemon.errors import DaemonError
from daemon.fleet.release.minisign import SecretKey, parse_signatures, sign
from daemon.fleet.release.release import MANIFEST_NAME, SIGNATURE_NAME, Claim, FileEntry, Manifest, parse_manifest
from daemon.model.runtime import Model, file_sha256

logger = logging.getLogger(__name__)

SIGN_BATCH = 1  # the interface is read at the model's own batch size, as a node's first load reads it
# Without the XNNPACK delegate: the signing machine need not run the model as a node would (the
# interface leaves out the DELEGATE nodes a delegate adds either way: model/interface.py).
SIGN_XNNPACK = False


def _untrusted_comment(sk: SecretKey) -> str:
    return f"signature from edge-inferd fleet sign, key {sk.key_id_hex}"


def make_release(out_dir: Path | str, model_name: str, version: str, serial: int, model_path: Path | str,
                 labels_path: Optional[Path | str], secret_key: SecretKey, claims: Sequence[Claim] = (),
                 summary: str = "") -> Manifest:
    """A new release in `out_dir` (created if needed; refused if it already holds one): the model and
    labels copied in under their own names, manifest.json, and one signature by `secret_key`.

    The model is loaded as the daemon loads it (ModelError when it could not be served), so a release
    never carries a model every node would refuse."""
    out_dir = Path(out_dir)
    if (out_dir / MANIFEST_NAME).exists() or (out_dir / SIGNATURE_NAME).exists():
        raise DaemonError(f"{out_dir}: already holds a release; sign a new serial into a new folder "
                          "(or add a signature to this one)")
    sources = [Path(model_path)] + ([Path(labels_path)] if labels_path is not None else [])
    if len({p.name for p in sources}) != len(sources):
        raise DaemonError(f"the model and the labels are both named {sources[0].name!r}: rename one")
    interface = Model(sources[0], max_batch=SIGN_BATCH, xnnpack=SIGN_XNNPACK).interface
    try:
        entries = tuple(FileEntry(p.name, p.stat().st_size, file_sha256(p)) for p in sources)
        manifest = Manifest(model_name, version, serial, entries, sources[0].name,
                            sources[1].name if labels_path is not None else None, interface, tuple(claims), summary)
        data = manifest.to_bytes()
        parse_manifest(data)  # what is signed must be what a node reads: its rules on names, versions, claims
        signature = sign(data, secret_key, manifest.trusted_comment, _untrusted_comment(secret_key))
        out_dir.mkdir(parents=True, exist_ok=True)
        for source, entry in zip(sources, entries):
            _copy_in(source, out_dir / entry.name, entry)
        _write_new(out_dir / MANIFEST_NAME, data)
        _write_new(out_dir / SIGNATURE_NAME, signature.encode("utf-8"))
    except OSError as exc:
        raise DaemonError(f"{exc.filename or out_dir}: {exc.strerror or exc}") from None
    logger.debug("release %s %s serial %d in %s, signed by %s", model_name, version, serial, out_dir,
                secret_key.key_id_hex)
    return manifest


def _copy_in(source: Path, target: Path, entry: FileEntry) -> None:
    if source.resolve() != target.resolve():
        shutil.copyfile(source, target)
    if file_sha256(target) != entry.sha256:  # the source changed under us: the manifest would lie
        raise DaemonError(f"{source}: changed while it was copied into the release; sign again")


def _write_new(path: Path, data: bytes) -> None:
    with open(path, "xb") as fh:  # "x": two signers racing into one folder cannot clobber each other
        fh.write(data)


def add_signature(out_dir: Path | str, secret_key: SecretKey) -> Manifest:
    """Append `secret_key`'s signature to the release in `out_dir` (a second or third signer).

    Refused when this key already signed it: the same key twice still counts once."""
    out_dir = Path(out_dir)
    try:
        data = (out_dir / MANIFEST_NAME).read_bytes()
        existing = (out_dir / SIGNATURE_NAME).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DaemonError(f"{out_dir}: no release to add a signature to ({getattr(exc, 'strerror', None) or exc})") \
            from None
    manifest = parse_manifest(data)
    signers = {sig.key_id for sig in parse_signatures(existing)}
    if secret_key.key_id in signers:
        raise DaemonError(f"{out_dir}: key {secret_key.key_id_hex} already signed this release")
    text = existing if existing.endswith("\n") else existing + "\n"
    text += sign(data, secret_key, manifest.trusted_comment, _untrusted_comment(secret_key))
    partial = out_dir / f".{SIGNATURE_NAME}.partial"
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, out_dir / SIGNATURE_NAME)  # a reader sees the old signatures or all of them
    logger.debug("added a signature by %s to %s (%d in all)", secret_key.key_id_hex, out_dir, len(signers) + 1)
    return manifest
