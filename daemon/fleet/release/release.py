"""A release's manifest (schema `edge-inferd.release/1`, docs/fleet.md "Release"): its dataclasses,
the strict reader a node runs on bytes from the network, and the trust decision over its signatures.

Everything a node reads here comes from a server it does not control, so the reader refuses
with a `Refused` that names the key (`files[1].sha256: must be 64 hex digits`) and never lets
another exception out: tests/fleet/release/test_release.py feeds it arbitrary JSON to hold it to that.
The operator's side (copying files in, signing) is daemon/fleet/controller/publish.py.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from daemon.fleet.release.minisign import MinisignError, PublicKey, Signature, parse_signatures
from daemon.fleet.release.refusal import (BAD_MANIFEST, BAD_SIGNATURE, TOO_FEW_SIGNATURES, UNKNOWN_VERSION, UNSAFE_NAME,
                                  UNTRUSTED_KEY, Refused)
from daemon.model.interface import Interface, TensorSpec

SCHEMA = "edge-inferd.release/1"
MANIFEST_NAME = "manifest.json"
SIGNATURE_NAME = "manifest.json.minisig"
# A file name may not take the manifest's or its signature's place in the release directory.
RESERVED_NAMES = frozenset({MANIFEST_NAME, SIGNATURE_NAME})
MAX_NAME_BYTES = 255  # NAME_MAX of Linux file systems
MAX_MANIFEST_BYTES = 1 << 20  # a manifest lists a few files; anything near this is not one
MAX_CLAIMED_VERSION = 64  # an unverified version longer than this is shown as unknown
METRICS = ("accuracy", "roc_auc", "mae")  # as `edge-inferd validate` prints them, by output kind
_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_REQUIRED = object()
_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", list: "a list", dict: "an object"}


@dataclass(frozen=True)
class FileEntry:
    name: str
    size: int
    sha256: str
    """Lower-case hex."""


@dataclass(frozen=True)
class Claim:
    """What the release's author measured: `metric` of `edge-inferd validate` on the .npz `validate_sha256`."""

    validate_sha256: str
    metric: str
    value: float


@dataclass(frozen=True)
class Manifest:
    model: str
    version: str
    serial: int
    files: tuple[FileEntry, ...]
    model_file: str
    labels_file: Optional[str]
    interface: Interface
    claims: tuple[Claim, ...] = ()
    summary: str = ""

    @property
    def trusted_comment(self) -> str:
        return trusted_comment(self.model, self.version, self.serial)

    def file(self, name: str) -> FileEntry:
        for entry in self.files:
            if entry.name == name:
                return entry
        raise KeyError(f"{name!r} is not in the manifest's files")

    def to_json(self) -> dict:
        doc: dict[str, Any] = {
            "schema": SCHEMA, "model": self.model, "version": self.version, "serial": self.serial,
            "files": [{"name": f.name, "size": f.size, "sha256": f.sha256} for f in self.files],
            "model_file": self.model_file, "interface": interface_to_json(self.interface),
            "claims": [{"validate_sha256": c.validate_sha256, "metric": c.metric, "value": c.value}
                       for c in self.claims],
            "summary": self.summary,
        }
        if self.labels_file is not None:
            doc["labels_file"] = self.labels_file
        return doc

    def to_bytes(self) -> bytes:
        """manifest.json as `fleet sign` writes it: sorted keys, indented, one newline at the end."""
        return (json.dumps(self.to_json(), sort_keys=True, indent=2) + "\n").encode("utf-8")


def trusted_comment(model: str, version: str, serial: int) -> str:
    """The signatures' trusted comment: the manifest's identity, covered by the global signature."""
    return f"model={model} version={version} serial={serial}"


def unsafe_reason(name: str) -> str:
    """Why `name` could leave (or clobber) the release's store directory; '' for a plain file name."""
    if not name:
        return "is empty"
    if "/" in name or "\\" in name:
        return "holds a path separator"
    if name in (".", ".."):
        return "is a directory reference"
    if "\0" in name:
        return "holds a NUL"
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return f"is longer than {MAX_NAME_BYTES} bytes"
    if name in RESERVED_NAMES:
        return "is the release's own manifest or signature"
    return ""


# --- reading ---


def _bad(key: str, why: str) -> Refused:
    return Refused(BAD_MANIFEST, f"{key}: {why}")


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return next((name for kind, name in _TYPE_NAMES.items() if isinstance(value, kind)), type(value).__name__)


def _is(value: Any, kind: type) -> bool:
    if isinstance(value, bool):  # JSON true is not the integer 1
        return False
    return isinstance(value, (int, float)) if kind is float else isinstance(value, kind)


def _get(obj: dict, key: str, kind: type, where: str, default: Any = _REQUIRED) -> Any:
    name = f"{where}.{key}" if where else key
    if key not in obj or (obj[key] is None and default is not _REQUIRED):
        if default is _REQUIRED:
            raise _bad(name, "missing")
        return default
    value = obj[key]
    if not _is(value, kind):
        raise _bad(name, f"must be {_TYPE_NAMES[kind]}, not {_type_name(value)}")
    if kind is float and not math.isfinite(value):
        raise _bad(name, "must be a finite number")
    return value


def _items(obj: dict, key: str, where: str = "", required: bool = True) -> list[tuple[str, dict]]:
    """(its key path, the object) for each entry of the list `key`, each checked to be an object."""
    name = f"{where}.{key}" if where else key
    values = _get(obj, key, list, where, _REQUIRED if required else [])
    for i, value in enumerate(values):
        if not isinstance(value, dict):
            raise _bad(f"{name}[{i}]", f"must be an object, not {_type_name(value)}")
    return [(f"{name}[{i}]", value) for i, value in enumerate(values)]


def _sha256(obj: dict, key: str, where: str) -> str:
    value = _get(obj, key, str, where)
    if not _SHA256.fullmatch(value):
        raise _bad(f"{where}.{key}", "must be 64 hex digits")
    return value.lower()


def _plain_name(obj: dict, key: str, where: str = "", default: Any = _REQUIRED) -> Any:
    value = _get(obj, key, str, where, default)
    why = unsafe_reason(value) if isinstance(value, str) else ""
    if why:
        raise Refused(UNSAFE_NAME, f"{f'{where}.' if where else ''}{key}: {value[:MAX_NAME_BYTES]!r} {why}")
    return value


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict:
    # Two parsers reading one signed document differently is how signature checks get bypassed.
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _bad(key, "appears twice in one object")
        seen[key] = value
    return seen


def _no_constant(name: str) -> Any:
    raise _bad("manifest", f"{name} is not JSON")


def _load_json(data: bytes) -> dict:
    if len(data) > MAX_MANIFEST_BYTES:
        raise _bad("manifest", f"{len(data)} bytes, above the {MAX_MANIFEST_BYTES} a manifest may have")
    try:
        doc = json.loads(data.decode("utf-8"), object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise _bad("manifest", "not UTF-8") from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError; so is a 5000-digit number
        raise _bad("manifest", f"not JSON ({str(exc)[:200]})") from None
    if not isinstance(doc, dict):
        raise _bad("manifest", f"must be a JSON object, not {_type_name(doc)}")
    return doc


def parse_manifest(data: bytes) -> Manifest:
    """manifest.json's bytes -> Manifest; Refused(BAD_MANIFEST or UNSAFE_NAME) naming the key otherwise."""
    doc = _load_json(data)
    schema = _get(doc, "schema", str, "")
    if schema != SCHEMA:
        raise _bad("schema", f"{schema[:100]!r} is not {SCHEMA!r}")
    model = _plain_name(doc, "model")
    version = _get(doc, "version", str, "")
    for key, value in (("model", model), ("version", version)):
        if not value or any(ch.isspace() for ch in value):  # they are words of the trusted comment
            raise _bad(key, "must be non-empty, without spaces")
    serial = _get(doc, "serial", int, "")
    if serial < 0:
        raise _bad("serial", "must not be negative")
    files = _files(doc)
    model_file = _plain_name(doc, "model_file")
    labels_file = _plain_name(doc, "labels_file", default=None)
    listed = {entry.name for entry in files}
    for key, name in (("model_file", model_file), ("labels_file", labels_file)):
        if name is not None and name not in listed:
            raise _bad(key, f"{name!r} is not in files")
    interface = _interface(_get(doc, "interface", dict, ""), "interface")
    return Manifest(model, version, serial, files, model_file, labels_file, interface, _claims(doc),
                    _get(doc, "summary", str, "", ""))


def _files(doc: dict) -> tuple[FileEntry, ...]:
    entries = []
    for where, item in _items(doc, "files"):
        size = _get(item, "size", int, where)
        if size < 0:
            raise _bad(f"{where}.size", "must not be negative")
        entries.append(FileEntry(_plain_name(item, "name", where), size, _sha256(item, "sha256", where)))
    names = [entry.name for entry in entries]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise _bad("files", f"lists {', '.join(map(repr, twice))} more than once")
    return tuple(entries)


def _claims(doc: dict) -> tuple[Claim, ...]:
    claims = []
    for where, item in _items(doc, "claims", required=False):
        metric = _get(item, "metric", str, where)
        if metric not in METRICS:
            raise _bad(f"{where}.metric", f"{metric[:100]!r} is not one of {', '.join(METRICS)}")
        claims.append(Claim(_sha256(item, "validate_sha256", where), metric, float(_get(item, "value", float, where))))
    return tuple(claims)


# --- the interface, as JSON (TensorSpec's fields; the dtype by its numpy name) ---


def interface_to_json(interface: Interface) -> dict:
    return {"inputs": [_tensor_to_json(t) for t in interface.inputs],
            "outputs": [_tensor_to_json(t) for t in interface.outputs],
            "ops": list(interface.ops), "quantized_tensors": interface.quantized_tensors,
            "resource_tensors": interface.resource_tensors}


def _tensor_to_json(spec: TensorSpec) -> dict:
    return {"name": spec.name, "index": spec.index, "shape": list(spec.shape), "signature": list(spec.signature),
            "dtype": spec.dtype.name, "scale": spec.scale, "zero_point": spec.zero_point}


def interface_from_json(doc: dict) -> Interface:
    """The `interface` object -> Interface, so a node can run `Interface.problems()` on it and check it
    against its routes before fetching the model; Refused(BAD_MANIFEST) naming the key otherwise."""
    if not isinstance(doc, dict):
        raise _bad("interface", f"must be an object, not {_type_name(doc)}")
    return _interface(doc, "interface")


def _interface(doc: dict, where: str) -> Interface:
    inputs = tuple(_tensor(item, path, i) for i, (path, item) in enumerate(_items(doc, "inputs", where)))
    outputs = tuple(_tensor(item, path, i) for i, (path, item) in enumerate(_items(doc, "outputs", where)))
    ops = _get(doc, "ops", list, where, [])
    for i, op in enumerate(ops):
        if not isinstance(op, str):
            raise _bad(f"{where}.ops[{i}]", f"must be a string, not {_type_name(op)}")
    counts = [_get(doc, key, int, where, 0) for key in ("quantized_tensors", "resource_tensors")]
    if min(counts) < 0:
        raise _bad(where, "tensor counts must not be negative")
    return Interface(inputs, outputs, tuple(ops), *counts)


def _tensor(item: dict, where: str, position: int) -> TensorSpec:
    shape = _dims(item, "shape", where, _REQUIRED)
    signature = _dims(item, "signature", where, shape)
    return TensorSpec(_get(item, "index", int, where, position), _get(item, "name", str, where), shape, signature,
                      _dtype(_get(item, "dtype", str, where), f"{where}.dtype"),
                      float(_get(item, "scale", float, where, 0.0)), _get(item, "zero_point", int, where, 0))


def _dims(item: dict, key: str, where: str, default: Any) -> tuple[int, ...]:
    values = _get(item, key, list, where, default)
    if not all(_is(v, int) and v >= -1 for v in values):  # -1: a dynamic dimension (shape_signature)
        raise _bad(f"{where}.{key}", "must be a list of integers (-1 or more)")
    return tuple(values)


def _dtype(name: str, key: str) -> np.dtype:
    try:
        dtype = np.dtype(name)
    except (TypeError, ValueError):
        raise _bad(key, f"{name[:100]!r} is not a numpy dtype name") from None
    if dtype.name != name:  # only canonical names ('int8', not 'i1' or '<i1'): one spelling per dtype
        raise _bad(key, f"{name[:100]!r} is not a numpy dtype name (did you mean {dtype.name!r}?)")
    return dtype


def claimed(data: bytes) -> tuple[Optional[int], str]:
    """(serial, version) as manifest bytes claim them before anything is verified, for a refusal's
    `rejected` entry only (no decision rests on them): None, and UNKNOWN_VERSION, where the bytes say
    nothing usable (not JSON, no such key, a version that is not one plain word)."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        doc = None
    doc = doc if isinstance(doc, dict) else {}
    serial, version = doc.get("serial"), doc.get("version")
    plain = isinstance(version, str) and 0 < len(version) <= MAX_CLAIMED_VERSION and version.isprintable() \
        and not any(c.isspace() for c in version)
    return (serial if type(serial) is int and serial >= 0 else None), (version if plain else UNKNOWN_VERSION)


# --- trust ---


def verify_manifest(manifest_bytes: bytes, signature_text: str | bytes, trusted: Sequence[PublicKey],
                    threshold: int) -> Manifest:
    """The manifest, when at least `threshold` distinct keys of `trusted` signed exactly these bytes with
    the trusted comment `model=<m> version=<v> serial=<s>` of this manifest; Refused otherwise.

    A trusted key's signature that does not verify refuses the release even when others would reach the
    threshold: it means the manifest or its comment was changed after signing, which no valid signature
    excuses. Signatures by keys outside `trusted` are ignored (but named when nothing else signed)."""
    if threshold < 1:
        raise ValueError("threshold must be at least 1")
    keys = {pk.key_id: pk for pk in trusted}
    valid, strangers = {}, []
    for sig in _signatures(signature_text):
        pk = keys.get(sig.key_id)
        if pk is None:
            strangers.append(sig.key_id_hex)
        elif not sig.verify(manifest_bytes, pk):
            raise Refused(BAD_SIGNATURE, f"the signature by trusted key {sig.key_id_hex} does not verify: the "
                                         "manifest or its trusted comment changed after signing")
        else:
            valid[sig.key_id] = sig
    if not valid:
        raise Refused(UNTRUSTED_KEY, f"signed only by keys that are not trusted: {', '.join(sorted(set(strangers)))}")
    manifest = parse_manifest(manifest_bytes)
    for sig in valid.values():
        if sig.trusted_comment != manifest.trusted_comment:
            raise Refused(BAD_SIGNATURE, f"key {sig.key_id_hex} signed the trusted comment "
                                         f"{sig.trusted_comment[:200]!r}, not {manifest.trusted_comment!r}")
    if len(valid) < threshold:
        signers = ", ".join(sorted(sig.key_id_hex for sig in valid.values()))
        also = f"; also signed by untrusted {', '.join(sorted(set(strangers)))}" if strangers else ""
        raise Refused(TOO_FEW_SIGNATURES, f"{len(valid)} trusted key(s) signed ({signers}), {threshold} needed{also}")
    return manifest


def _signatures(text: str | bytes) -> list[Signature]:
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        return parse_signatures(text)
    except UnicodeDecodeError:
        raise Refused(BAD_SIGNATURE, "the signature file is not UTF-8 text") from None
    except MinisignError as exc:
        raise Refused(BAD_SIGNATURE, str(exc)) from None
