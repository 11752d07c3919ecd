"""The `http:` section: the Open Inference Protocol (KServe v2) listener beside MQTT, read and checked.

The frozen section and its reader, like homeassistant.py. Off by default (`port: null`): a
daemon that does not ask for it opens no HTTP port. The listener itself is
daemon/transport/http_server.py; docs/http.md shows it from a client's side.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional

from daemon.config.mqtt import PORT_LIMIT
from daemon.config.reader import Reader
from daemon.config.secrets import read_token

DEFAULT_ADDRESS = "127.0.0.1"
DEFAULT_MAX_CONNECTIONS = 64
DEFAULT_REQUEST_TIMEOUT_MS = 5000.0
DEFAULT_MAX_BODY_BYTES = 4 << 20  # 4 MiB: a v2 JSON body of a 1 MiB payload is ~3x its bytes
MIN_REQUEST_TIMEOUT_MS = 10.0


@dataclass(frozen=True)
class HttpTlsConfig:
    cert_file: Optional[Path] = None
    """The server's certificate chain (PEM), with key_file."""
    key_file: Optional[Path] = None
    """The certificate's private key (PEM)."""


@dataclass(frozen=True)
class HttpConfig:
    port: Optional[int] = None
    """Serve the Open Inference Protocol (KServe v2 REST) and `POST /routes/<route>` on this
    port (docs/http.md). null: no listener. Requests share the MQTT ones' rate check, admission,
    batching, cache and workers."""
    address: str = DEFAULT_ADDRESS
    """Address to bind; 0.0.0.0 exposes the listener to the network (set `token_file` then)."""
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    """Open connections at most (each is a thread while it lasts); one more is answered 503
    and closed at once. A connection that stalls holds its place for one request_timeout_ms at
    most; an idle keep-alive one for 15 s."""
    request_timeout_ms: float = DEFAULT_REQUEST_TIMEOUT_MS
    """A request's whole time, from its first byte (a connection's first request: from the
    connect, TLS handshake included): its line, headers and body must arrive within it (else
    408, connection closed) and its answer too (else 504). It is also the request's deadline
    in admission: one predicted to miss it is answered 503 at once instead of computed for
    nobody."""
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    """A larger body is answered 413: by its Content-Length (the body is then read and
    dropped, up to 32 MiB, so that the client sees the answer), or once inflated past it
    (Content-Encoding gzip or deflate)."""
    token_file: Optional[Path] = None
    """File holding a bearer token (its first line, at least 16 characters): every request
    but the health probes must then send `Authorization: Bearer <token>` (else 401). null:
    no authentication (keep the address on 127.0.0.1)."""
    tls: Optional[HttpTlsConfig] = None
    """HTTPS with this certificate and key; null: plain HTTP."""
    token: Optional[str] = field(default=None, repr=False, metadata={"doc": False})
    """The token read from `token_file` (not a YAML key; never logged)."""

    @property
    def enabled(self) -> bool:
        return self.port is not None


def read_http(r: Reader, root: Mapping, base: Path) -> HttpConfig:
    p, d = "http", HttpConfig()
    s = r.section(root, "http", ("port", "address", "max_connections", "request_timeout_ms", "max_body_bytes",
                                 "token_file", "tls"))
    port = r.get(s, "port", p, (int, type(None)), None, check=_port_error)
    token_file = r.get(s, "token_file", p, (str, type(None)), None)
    return HttpConfig(
        port=port,
        address=r.get(s, "address", p, str, d.address, check=lambda v: None if v else "must not be empty"),
        max_connections=r.get(s, "max_connections", p, int, d.max_connections, minimum=1),
        request_timeout_ms=float(r.get(s, "request_timeout_ms", p, (int, float), d.request_timeout_ms,
                                       minimum=MIN_REQUEST_TIMEOUT_MS)),
        max_body_bytes=r.get(s, "max_body_bytes", p, int, d.max_body_bytes, minimum=1),
        token_file=None if token_file is None else base / token_file,
        tls=_read_tls(r, s, base),
        token=read_token(r, s, p, base, token_file),
    )


def _port_error(value: Optional[int]) -> Optional[str]:
    if value is not None and not 0 < value < PORT_LIMIT:
        return f"must be a port in 1..{PORT_LIMIT - 1}, got {value}"
    return None


def _read_tls(r: Reader, s: Mapping, base: Path) -> Optional[HttpTlsConfig]:
    if s.get("tls") is None:
        return None
    t = r.section(s, "tls", HttpTlsConfig, path="http.tls")
    files = {}
    for key in ("cert_file", "key_file"):
        value = r.get(t, key, "http.tls", (str, type(None)), None, required=True)
        files[key] = None if value is None else base / value
        if files[key] is not None and not files[key].is_file():
            r.error(t, key, "http.tls", f"{files[key]}: file not found")
    return HttpTlsConfig(**files)
