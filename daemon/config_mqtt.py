"""The `mqtt:` section: broker address, identity, session, TLS and credentials.

Split from config.py (which re-exports `MqttConfig`, `TlsConfig` and `parse_broker`);
the same two-pass rules apply: `read_mqtt` records every problem on the Reader.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional

from daemon.config_reader import Reader

DEFAULT_PORT = 1883
MAX_SESSION_EXPIRY_S = 0xFFFFFFFF
# The file systemd's LoadCredential=mqtt-password:... puts under $CREDENTIALS_DIRECTORY.
CREDENTIAL_NAME = "mqtt-password"
PROTOCOLS = {"5": 5, "3.1.1": 311, "311": 311}


@dataclass(frozen=True)
class TlsConfig:
    ca_file: Optional[Path] = None
    """CA certificates that sign the broker's certificate; None: the system's trust store."""
    cert_file: Optional[Path] = None
    """Client certificate, for brokers that require one (with key_file)."""
    key_file: Optional[Path] = None
    """The client certificate's private key."""


@dataclass(frozen=True)
class OutboxConfig:
    dir: Path = Path(".state/edge-inferd/outbox")
    """Replies made while the broker is away wait here (SQLite, mode 0700). Relative: under
    $STATE_DIRECTORY when systemd sets it (StateDirectory=), else next to the config file."""
    max_mb: float = 64.0
    """Size cap in MiB; past it the newest reply is refused and counted (its request is still
    unacked at the broker, so a QoS 1 request is redelivered and answered later). 0: no outbox."""


@dataclass(frozen=True)
class MqttConfig:
    broker: str = f"localhost:{DEFAULT_PORT}"
    """host:port of the broker ([v6addr]:port for IPv6)."""
    client_id: str = "edge-inferd"
    """MQTT client id; also the node id in `edge-inferd/<client_id>/status`."""
    protocol: int = 5
    """5 for MQTT v5 (default), 311 for 3.1.1."""
    qos: int = 1
    """QoS of subscriptions and replies."""
    keepalive_s: int = 30
    """Seconds between keepalive pings."""
    reconnect_min_s: int = 1
    """First reconnect delay in whole seconds; doubles up to `reconnect_max_s`."""
    reconnect_max_s: int = 2
    """Cap on the reconnect delay: low, so the daemon is back within about a second or two
    of a restarted broker (a LAN broker, not a cloud endpoint that must be spared)."""
    session_expiry_s: int = 86400
    """How long the broker keeps the daemon's session (subscriptions and unacked requests)
    while it is away, so nothing sent meanwhile is lost. 0: a clean session every connect.
    MQTT 3.1.1 has no expiry: any value > 0 means `clean_session=False`."""
    username: Optional[str] = None
    """Broker user name, or None for anonymous."""
    password: Optional[str] = field(default=None, repr=False)
    """Broker password: from `password_file`, or $CREDENTIALS_DIRECTORY/mqtt-password (systemd's
    LoadCredential=), or (discouraged) inline. Never logged; `repr=False` keeps it out of reprs."""
    tls: Optional[TlsConfig] = None
    """TLS to the broker, hostname verified; None: plain TCP."""
    outbox: OutboxConfig = OutboxConfig()
    """The on-disk outbox (daemon/outbox.py)."""

    @property
    def host(self) -> str:
        return parse_broker(self.broker)[0]

    @property
    def port(self) -> int:
        return parse_broker(self.broker)[1]

    @property
    def is_v5(self) -> bool:
        return self.protocol == 5

    @property
    def persistent(self) -> bool:
        return self.session_expiry_s > 0

    @property
    def status_topic(self) -> str:
        return f"edge-inferd/{self.client_id}/status"

    @property
    def stats_topic(self) -> str:
        return f"edge-inferd/{self.client_id}/stats"


def parse_broker(value: str) -> tuple[str, int]:
    """'host:port', 'host' or '[v6]:port' -> (host, port); ValueError when malformed."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError("broker must be a non-empty 'host:port' string")
    host, sep, port = value.rpartition(":")
    if not sep or (host.count(":") and not host.startswith("[")):
        host, port = value, str(DEFAULT_PORT)
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"broker {value!r} is not 'host:port' with a port in 1..65535")
    return host, int(port)


def read_mqtt(r: Reader, m: Mapping, base: Path) -> MqttConfig:
    p, d = "mqtt", MqttConfig()
    broker = r.get(m, "broker", p, str, d.broker)
    try:
        parse_broker(broker)
    except ValueError as exc:
        r.error(m, "broker", p, str(exc))
    protocol = r.get(m, "protocol", p, (int, float, str), "5")
    if str(protocol) not in PROTOCOLS:
        r.error(m, "protocol", p, f"must be 5 or 3.1.1, got {protocol!r}")
    return MqttConfig(
        broker=broker,
        client_id=r.get(m, "client_id", p, str, d.client_id, check=_no_wildcards),
        protocol=PROTOCOLS.get(str(protocol), 5),
        qos=r.get(m, "qos", p, int, d.qos, choices=(0, 1, 2)),
        keepalive_s=r.get(m, "keepalive_s", p, int, d.keepalive_s, minimum=5),
        reconnect_min_s=r.get(m, "reconnect_min_s", p, int, d.reconnect_min_s, minimum=1),
        reconnect_max_s=r.get(m, "reconnect_max_s", p, int, d.reconnect_max_s, minimum=1),
        session_expiry_s=r.get(m, "session_expiry_s", p, int, d.session_expiry_s, minimum=0,
                               check=_within_session_expiry),
        username=r.get(m, "username", p, (str, type(None)), None),
        password=_read_password(r, m, base),
        tls=_read_tls(r, m, base),
        outbox=_read_outbox(r, m, base),
    )


def _read_password(r: Reader, m: Mapping, base: Path) -> Optional[str]:
    """The inline password, else password_file, else systemd's credential; errors name the key."""
    inline = r.get(m, "password", "mqtt", (str, type(None)), None)
    path = r.get(m, "password_file", "mqtt", (str, type(None)), None)
    if inline is not None and path is not None:
        r.error(m, "password_file", "mqtt", "set either password or password_file, not both")
    if path is None:
        credentials = os.environ.get("CREDENTIALS_DIRECTORY")
        candidate = Path(credentials) / CREDENTIAL_NAME if credentials else None
        if inline is not None or candidate is None or not candidate.is_file():
            return inline
        path = str(candidate)
    try:
        return (base / path).read_text(encoding="utf-8").rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        r.error(m, "password_file", "mqtt", f"cannot read {base / path}: {getattr(exc, 'strerror', None) or exc}")
        return None


def _read_tls(r: Reader, m: Mapping, base: Path) -> Optional[TlsConfig]:
    if m.get("tls") is None:
        return None
    t = r.section(m, "tls", TlsConfig, path="mqtt.tls")
    files = {}
    for key in ("ca_file", "cert_file", "key_file"):
        value = r.get(t, key, "mqtt.tls", (str, type(None)), None)
        files[key] = None if value is None else base / value
        if files[key] is not None and not files[key].is_file():
            r.error(t, key, "mqtt.tls", f"{files[key]}: file not found")
    if (files["cert_file"] is None) != (files["key_file"] is None):
        r.error(t, "cert_file", "mqtt.tls", "cert_file and key_file go together")
    return TlsConfig(**files)


def _read_outbox(r: Reader, m: Mapping, base: Path) -> OutboxConfig:
    d = OutboxConfig()
    o = r.section(m, "outbox", OutboxConfig, path="mqtt.outbox")
    state_directory = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    return OutboxConfig(
        dir=(Path(state_directory) if state_directory else base) / r.get(o, "dir", "mqtt.outbox", str, str(d.dir)),
        max_mb=r.get(o, "max_mb", "mqtt.outbox", float, d.max_mb, minimum=0),
    )


def _within_session_expiry(value: int) -> Optional[str]:
    return None if value <= MAX_SESSION_EXPIRY_S else f"must be <= {MAX_SESSION_EXPIRY_S} (MQTT's 32-bit limit)"


def _no_wildcards(value: str) -> Optional[str]:
    if not value or any(c in value for c in "+#/"):
        return "must be non-empty without '+', '#' or '/' (it is part of the status topic)"
    return None
