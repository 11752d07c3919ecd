"""`routes[].escalate.to_v2`: the cascade's far tier on an Open Inference Protocol (KServe v2) server.

The frozen section and its reader; the behaviour is daemon/serve/far_v2.py (the parking, the
senders and the breaker) and daemon/transport/v2_client.py (one infer call). Any v2 server
will do: Triton, KServe, Seldon MLServer, another edge-inferd's `http:` listener.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional
from urllib.parse import urlsplit

from daemon.config.reader import Reader
from daemon.config.secrets import read_token

DEFAULT_CONCURRENCY = 2
DEFAULT_BATCH = 8
DEFAULT_INPUT = "input"
DEFAULT_DATATYPE = "FP32"
DEFAULT_BREAKER_FAILURES = 3
DEFAULT_BREAKER_OPEN_S = 10.0
MAX_BATCH = 1024
# What the far tier can be sent: the near node's preprocessed rows are real values (float32).
DATATYPES = ("FP32", "FP64", "FP16")
_KEYS = ("url", "model", "version", "input", "output", "headers", "token_file", "ca_file", "concurrency", "batch",
         "timeout_ms", "binary", "breaker")


@dataclass(frozen=True)
class V2TierConfig:
    url: str
    """The v2 server's base URL, `http://host:port` or `https://...` (a path prefix is kept:
    KServe behind a gateway); infer calls go to `<url>/v2/models/<model>[/versions/<version>]/infer`."""
    model: str
    """The model's name on that server."""
    version: Optional[str] = None
    """The model's version there; null: the server's default."""
    input_name: str = field(default=DEFAULT_INPUT, metadata={"yaml": "input.name"})
    """The input tensor's name in the infer request."""
    input_datatype: str = field(default=DEFAULT_DATATYPE, metadata={"yaml": "input.datatype"})
    """Its v2 datatype: FP32, FP64 or FP16 (the rows are the route's input after `escalate.preprocess`,
    real values)."""
    output: Optional[str] = None
    """The output tensor holding the scores, one row of as many scores as the route's model has
    labels per request; null: the response's first output."""
    headers: tuple[tuple[str, str], ...] = field(default=(), metadata={"doc_type": "mapping", "doc_default": "{}"})
    """Extra request headers, e.g. `Host: appliance.default.example.com` for KServe's routing."""
    token_file: Optional[Path] = None
    """File holding a bearer token (its first line) sent as `Authorization: Bearer <token>`."""
    ca_file: Optional[Path] = None
    """https: the CA bundle (PEM) that signs the server's certificate; null: the system's."""
    concurrency: int = DEFAULT_CONCURRENCY
    """Infer calls in flight at once (each on a connection of its own, kept alive)."""
    batch: int = DEFAULT_BATCH
    """Escalated requests sent together in one infer call at most (rows along the batch dimension)."""
    timeout_ms: Optional[float] = field(default=None, metadata={"doc_default": "escalate.timeout_ms"})
    """This long after the request arrived the local answer goes out (`"escalation": "timeout"`)."""
    binary: bool = False
    """Send the rows with the binary tensor extension (Triton, KServe) instead of JSON lists, and
    ask for binary outputs; false: JSON both ways, which every v2 server speaks."""
    breaker_failures: int = field(default=DEFAULT_BREAKER_FAILURES, metadata={"yaml": "breaker.failures"})
    """Failed calls in a row that open the breaker: then no call is made for `breaker.open_s`, the
    escalated requests get their local answer (`"escalation": "error"`) at once, and one line is
    logged per episode."""
    breaker_open_s: float = field(default=DEFAULT_BREAKER_OPEN_S, metadata={"yaml": "breaker.open_s"})
    """How long the breaker stays open before one call tries the server again."""
    token: Optional[str] = field(default=None, repr=False, metadata={"doc": False})
    """The token read from `token_file` (not a YAML key; never logged)."""

    @property
    def infer_path(self) -> str:
        base = urlsplit(self.url).path.rstrip("/")
        version = f"/versions/{self.version}" if self.version else ""
        return f"{base}/v2/models/{self.model}{version}/infer"


def read_v2_tier(r: Reader, e: Mapping, p: str, base: Path) -> Optional[V2TierConfig]:
    """routes[i].escalate.to_v2 (None when absent); `p` is the escalate section's path."""
    if e.get("to_v2") is None:
        return None
    p = f"{p}.to_v2"
    s = r.section(e, "to_v2", _KEYS, path=p)
    url = r.get(s, "url", p, str, "", required=True, check=_url_error)
    model = r.get(s, "model", p, str, "", required=True, check=lambda v: None if v and "/" not in v else
                  "must be a model name (no '/')")
    version = r.get(s, "version", p, (str, int, type(None)), None)
    inp = r.section(s, "input", ("name", "datatype"), path=f"{p}.input")
    brk = r.section(s, "breaker", ("failures", "open_s"), path=f"{p}.breaker")
    token_file = r.get(s, "token_file", p, (str, type(None)), None)
    ca_file = r.get(s, "ca_file", p, (str, type(None)), None)
    if ca_file is not None and not (base / ca_file).is_file():
        r.error(s, "ca_file", p, f"{base / ca_file}: file not found")
    timeout = r.get(s, "timeout_ms", p, (int, float, type(None)), None, minimum=1)
    return V2TierConfig(
        url=url.rstrip("/"), model=model, version=None if version is None else str(version),
        input_name=r.get(inp, "name", f"{p}.input", str, DEFAULT_INPUT),
        input_datatype=r.get(inp, "datatype", f"{p}.input", str, DEFAULT_DATATYPE, choices=DATATYPES),
        output=r.get(s, "output", p, (str, type(None)), None),
        headers=_read_headers(r, s, p),
        token_file=None if token_file is None else base / token_file,
        ca_file=None if ca_file is None else base / ca_file,
        concurrency=r.get(s, "concurrency", p, int, DEFAULT_CONCURRENCY, minimum=1),
        batch=r.get(s, "batch", p, int, DEFAULT_BATCH, minimum=1, check=lambda v: None if v <= MAX_BATCH else
                    f"must be at most {MAX_BATCH}"),
        timeout_ms=None if timeout is None else float(timeout),
        binary=r.get(s, "binary", p, bool, False),
        breaker_failures=r.get(brk, "failures", f"{p}.breaker", int, DEFAULT_BREAKER_FAILURES, minimum=1),
        breaker_open_s=float(r.get(brk, "open_s", f"{p}.breaker", (int, float), DEFAULT_BREAKER_OPEN_S, minimum=0)),
        token=read_token(r, s, p, base, token_file),
    )


def _url_error(url: str) -> Optional[str]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"must be an http:// or https:// URL with a host, got {url!r}"
    if parts.query or parts.fragment:
        return "must not carry a query or fragment (the infer path is added to it)"
    try:
        parts.port  # noqa: B018 -- raises on a port out of range
    except ValueError as exc:
        return str(exc)
    return None


def _read_headers(r: Reader, s: Mapping, p: str) -> tuple[tuple[str, str], ...]:
    h = r.get(s, "headers", p, (dict, type(None)), None) or {}
    headers = []
    for name, value in h.items():
        if not isinstance(name, str) or not name or any(c in name for c in " :\r\n") or not isinstance(value, str) \
                or "\r" in value or "\n" in value:
            r.error(h, name, f"{p}.headers", "must be a header name mapped to a one-line string")
        elif name.lower() in ("content-length", "content-type", "authorization", "inference-header-content-length"):
            r.error(h, name, f"{p}.headers", "is set by the daemon (authorization: use token_file)")
        else:
            headers.append((name, value))
    return tuple(headers)
