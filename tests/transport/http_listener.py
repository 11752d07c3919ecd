"""A real HTTP listener (daemon/transport/http_server.py) on a free port for the transport tests,
without the rest of the service: the bundled config's routes, and an intake that answers nothing
(so only what the listener answers itself, before serving, comes back), or a given one; a
self-signed certificate for TLS."""

from __future__ import annotations

import dataclasses
import datetime
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

from daemon.config.http import HttpConfig
from daemon.config.loader import load_config
from daemon.obs.stats import Stats
from daemon.tools.broker import free_port
from daemon.transport.http_calls import Calls
from daemon.transport.http_handler import HttpRoute
from daemon.transport.http_server import HttpListener

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "t0ken-for-the-http-tests-0123456789"
STOP_S = 1.0


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for `localhost` (valid a day) and its key, as PEM files: (cert, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = directory / "cert.pem", directory / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


def bundled_routes() -> dict[str, HttpRoute]:
    """config.yaml's routes, each at a fixed version."""
    config = load_config(ROOT / "config.yaml")
    return {r.name: HttpRoute(r, lambda: "0" * 12) for r in config.routes}


@contextmanager
def running(config: HttpConfig, routes: Optional[dict] = None,
            on_burst: Callable = lambda inbounds: None) -> Iterator[HttpListener]:
    """The listener, started on `config` (its port: a free one when None), stopped after."""
    if config.port is None:
        config = dataclasses.replace(config, port=free_port())
    listener = HttpListener(config, routes or {}, Calls(on_burst), Stats(), lambda topic: None)
    listener.start()
    try:
        yield listener
    finally:
        listener.stop(STOP_S)
