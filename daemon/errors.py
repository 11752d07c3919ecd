"""The daemon's exception tree. Only `cli.py` turns these into exit codes."""

from __future__ import annotations

from typing import Any, Sequence

# Error codes carried in error replies (the contract: README.md, Messages).
BAD_PAYLOAD = "bad_payload"
BAD_SHAPE = "bad_shape"
TOO_LARGE = "too_large"
EXPIRED = "expired"
OVERLOADED = "overloaded"
INTERNAL = "internal"
SUPERSEDED = "superseded"  # coalesce: latest, a newer request of the same device was queued
RATE_LIMITED = "rate_limited"  # min_interval_ms: the device sent again too soon
# sysexits.h EX_CONFIG: an invalid config or model. systemd units RestartPreventExitStatus=78, and a
# worker process that exits with it halts its supervisor instead of a restart loop.
EXIT_CONFIG = 78
ERROR_CODES = (BAD_PAYLOAD, BAD_SHAPE, TOO_LARGE, EXPIRED, OVERLOADED, INTERNAL, SUPERSEDED, RATE_LIMITED)


class DaemonError(Exception):
    """Base class of every error the daemon raises on purpose."""


class ConfigError(DaemonError):
    """The config is invalid; `errors` holds every problem as `key.path: message`."""

    def __init__(self, errors: Sequence[str]):
        self.errors = tuple(errors)
        super().__init__("\n".join(self.errors))


class PayloadError(DaemonError):
    """A request cannot be served; answered with an error reply, never fatal."""

    def __init__(self, code: str, message: str, request_id: Any = None):
        if code not in ERROR_CODES:
            raise ValueError(f"unknown error code {code!r}")
        self.code = code
        self.message = message
        self.request_id = request_id
        super().__init__(f"{code}: {message}")


class ModelError(DaemonError):
    """A model file cannot be used; names the file and the reason."""

    def __init__(self, path: object, reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")
