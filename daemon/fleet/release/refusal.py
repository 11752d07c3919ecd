"""Why a release was refused: one exception with a code from the protocol (docs/fleet.md,
"Error codes"), carried into the reported document's `error` and `rejected[]`."""

from __future__ import annotations

from daemon.errors import DaemonError

BAD_MANIFEST = "bad_manifest"
UNSAFE_NAME = "unsafe_name"
BAD_SIGNATURE = "bad_signature"
UNTRUSTED_KEY = "untrusted_key"
TOO_FEW_SIGNATURES = "too_few_signatures"
SERIAL_MISMATCH = "serial_mismatch"
DOWNGRADE = "downgrade"
WRONG_MODEL = "wrong_model"
INTERFACE = "interface"
TOO_LARGE = "too_large"
NO_SPACE = "no_space"
DOWNLOAD = "download"
SHA256_MISMATCH = "sha256_mismatch"
SIZE_MISMATCH = "size_mismatch"
LOAD = "load"
GATE = "gate"
CLAIM = "claim"
CANARY = "canary"
OPERATOR = "operator"
# A refused release's version in `rejected[]` when no manifest says one it could be read from.
UNKNOWN_VERSION = "unknown"
CODES = (BAD_MANIFEST, UNSAFE_NAME, BAD_SIGNATURE, UNTRUSTED_KEY, TOO_FEW_SIGNATURES, SERIAL_MISMATCH, DOWNGRADE,
         WRONG_MODEL, INTERFACE, TOO_LARGE, NO_SPACE, DOWNLOAD, SHA256_MISMATCH, SIZE_MISMATCH, LOAD, GATE, CLAIM,
         CANARY, OPERATOR)


class Refused(DaemonError):
    """A release (or a step of installing it) refused: `code` says which rule, `message` why,
    in words an operator acts on (naming the file, key or value). `final` is False for a
    failure that a later attempt may get past (a download cut off), True for one it never will
    (a bad signature, a 404)."""

    def __init__(self, code: str, message: str, final: bool = True):
        if code not in CODES:
            raise ValueError(f"unknown refusal code {code!r}")
        self.code = code
        self.message = message
        self.final = final
        super().__init__(f"{code}: {message}")

    def as_dict(self) -> dict:
        return {"code": self.code, "message": self.message}
