"""The bodies of `edge-inferd fleet VERB` (options: cli_parser._add_fleet; cli.py runs them and exits).

Each verb takes the parsed arguments and returns True when it succeeded; a failure it can explain
raises a DaemonError (a `Refused`, a `MinisignError`), which cli.py prints as one line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Optional

from daemon.errors import DaemonError
from daemon.fleet.release import minisign
from daemon.fleet.controller.publish import add_signature, make_release
from daemon.fleet.release.release import Claim, Manifest
from daemon.model.runtime import file_sha256

KEY_SUFFIX = ".key"
PUB_SUFFIX = ".pub"


def read_password(path: Optional[Path]) -> Optional[bytes]:
    """The first line of a password file (its newline is not part of the password), or None."""
    if path is None:
        return None
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise DaemonError(f"{path}: cannot read the password file ({exc.strerror or exc})") from None
    if not lines or not lines[0]:
        raise DaemonError(f"{path}: the password file's first line is empty")
    return lines[0]


def keygen(args: argparse.Namespace) -> bool:
    key, pub = Path(f"{args.out}{KEY_SUFFIX}"), Path(f"{args.out}{PUB_SUFFIX}")
    existing = [str(p) for p in (key, pub) if p.exists()]
    if existing:
        verb = "exists" if len(existing) == 1 else "exist"
        raise DaemonError(f"{' and '.join(existing)} already {verb}; not overwriting a key")
    password = read_password(args.password_file)
    sk = minisign.generate()
    pub_text = sk.public_key.to_text(args.comment)  # a comment it refuses is refused before any file is written
    minisign.write_secret_key(key, sk, password)
    try:
        with open(pub, "x", encoding="utf-8") as fh:
            fh.write(pub_text)
    except OSError as exc:
        key.unlink()  # half a key pair is no use, and the next keygen would refuse over it
        raise DaemonError(f"{pub}: cannot write the public key ({exc.strerror or exc})") from None
    print(f"wrote {key} (secret{', encrypted' if password else ''}) and {pub}, key id {sk.key_id_hex}",
          file=sys.stderr)
    print(sk.public_key.line)
    return True


def sign(args: argparse.Namespace) -> bool:
    sk = minisign.read_secret_key(args.key, read_password(args.password_file))
    if args.add_signature:
        manifest = add_signature(args.out, sk)
        _report(manifest, args.out, f"added a signature by {sk.key_id_hex}")
        return True
    missing = [f"--{name.replace('_', '-')}" for name in ("model_file", "name", "version", "serial")
               if getattr(args, name) is None]
    if missing:
        raise DaemonError(f"fleet sign: {', '.join(missing)} needed (unless --add-signature)")
    manifest = make_release(args.out, args.name, args.version, args.serial, args.model_file, args.labels, sk,
                            _claims(args), args.summary)
    _report(manifest, args.out, f"signed by {sk.key_id_hex}")
    return True


def _claims(args: argparse.Namespace) -> tuple[Claim, ...]:
    given = [args.claim_data is not None, args.claim_metric is not None, args.claim_value is not None]
    if not any(given):
        return ()
    if not all(given):
        raise DaemonError("fleet sign: --claim-data, --claim-metric and --claim-value go together")
    try:
        digest = file_sha256(args.claim_data)
    except OSError as exc:
        raise DaemonError(f"{args.claim_data}: cannot read the claim's data ({exc.strerror or exc})") from None
    return (Claim(digest, args.claim_metric, args.claim_value),)


def _report(manifest: Manifest, out: Path, what: str) -> None:
    print(f"{out}: {manifest.model} {manifest.version} serial {manifest.serial}, {what}")


VERBS: dict[str, Callable[[argparse.Namespace], bool]] = {"keygen": keygen, "sign": sign}


def run(args: argparse.Namespace) -> bool:
    """`edge-inferd fleet <args.fleet_command>`."""
    return VERBS[args.fleet_command](args)
