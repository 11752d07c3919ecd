"""The `mqtt:` section: broker address, identity, session, TLS and credentials.

Split from config.py (which re-exports `MqttConfig`, `TlsConfig` and `parse_broker`);
the same two-pass rules apply: `read_mqtt` records every problem on the Reader.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import re
import socket
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping, NamedTuple, Optional

from daemon.config.reader import Reader, systemd_base

DEFAULT_PORT = 1883
DEFAULT_TLS_PORT = 8883
SCHEMES = ("mqtt", "mqtts")
PORT_LIMIT = 65536
_HOSTNAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
CLIENT_ID_PREFIX = "edge-inferd"
# The fleet's shared topics (docs/fleet.md): desired documents and rollout records.
FLEET_TOPICS = "edge-inferd/fleet/"
# Keeps the default client id (and the status topic made from it) short; MQTT 3.1.1 only
# promises 23 bytes, but mosquitto, EMQX and HiveMQ take far longer ids.
MAX_HOSTNAME_IN_ID = 48
MAX_SESSION_EXPIRY_S = 0xFFFFFFFF
# The file systemd's LoadCredential=mqtt-password:... puts under $CREDENTIALS_DIRECTORY.
CREDENTIAL_NAME = "mqtt-password"
PROTOCOLS = {"5": 5, "3.1.1": 311, "311": 311}
TRANSPORTS = ("auto", "paho", "native")
AUTO, PAHO, NATIVE = TRANSPORTS
# The Python package behind `transport: native` (a default dependency on CPython >= 3.11).
NATIVE_PACKAGE = "mqtt5"


@dataclass(frozen=True)
class TlsConfig:
    ca_file: Optional[Path] = None
    """CA certificates that sign the broker's certificate; null: the system's trust store."""
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
    broker_window: int = 100
    """Native transport: once this many requests (at most ReceiveMaximum) wait unacked, all answered,
    their replies still awaiting PUBACK are written here and the requests acked: a broker that holds
    its window to us full confirms nothing (rumqttd 0.20: 100, whatever ReceiveMaximum says). 0: never."""


def default_client_id() -> str:
    """`edge-inferd-<hostname>`: unique per host, so two gateways never share an id (the broker
    would disconnect the older one: MQTT v5 reason "Session taken over")."""
    host = re.sub(r"[^A-Za-z0-9._-]+", "-", socket.gethostname()).strip("-.")[:MAX_HOSTNAME_IN_ID].strip("-.")
    return f"{CLIENT_ID_PREFIX}-{host}" if host else CLIENT_ID_PREFIX


class BrokerAddress(NamedTuple):
    host: str
    port: int
    tls: bool


@dataclass(frozen=True)
class MqttConfig:
    broker: str = f"localhost:{DEFAULT_PORT}"
    """Where the broker is: `host`, `host:port`, `[v6addr]:port`, `mqtt://host[:port]` or
    `mqtts://host[:port]`. The port defaults to 1883, or 8883 with TLS; `mqtts://` turns TLS on
    (with the system's trust store unless `tls` says otherwise)."""
    client_id: str = field(default_factory=default_client_id, metadata={"doc_default": "`edge-inferd-<hostname>`"})
    """MQTT client id; also the node id in `edge-inferd/<client_id>/status`. Unique per daemon:
    the broker disconnects the older of two clients with one id (v5 "Session taken over")."""
    share_group: Optional[str] = None
    """MQTT v5 shared subscription group: every route subscribes as `$share/<group>/<filter>`,
    so the broker splits the requests between the daemons (and gateways) in the group, each
    request to one of them. Each daemon keeps its own client_id and status. None: not shared."""
    protocol: int = 5
    """5 for MQTT v5 (default), 311 for 3.1.1 (written `3.1.1` in the file)."""
    qos: int = 1
    """QoS of subscriptions and replies: 0, 1 or 2."""
    keepalive_s: int = 30
    """Seconds between keepalive pings (at least 5)."""
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
    """Broker user name, or null for anonymous."""
    password: Optional[str] = field(default=None, repr=False)
    """Broker password, inline (discouraged: the config file is world-readable). Never logged."""
    password_file: Optional[Path] = None
    """File holding the broker password (its first line). Neither key set: systemd's
    LoadCredential=mqtt-password:FILE, read from $CREDENTIALS_DIRECTORY/mqtt-password."""
    tls: Optional[TlsConfig] = None
    """TLS to the broker, hostname verified; null: plain TCP, unless `broker` is `mqtts://`."""
    outbox: OutboxConfig = OutboxConfig()
    """The on-disk outbox (daemon/transport/outbox.py)."""
    transport: str = AUTO
    """The MQTT client underneath. `auto` (the default): one per protocol, `native` for MQTT v5 (the
    `mqtt5` Rust codec, daemon/transport/native.py: less CPU per request and faster drains than paho
    on every workload measured, docs/performance.md) and `paho` (paho-mqtt as shipped) for 3.1.1 and
    QoS 2, or where the mqtt5 package is missing (Python 3.10). `native` or `paho` by name forces one:
    native needs protocol 5 and qos 0 or 1; paho speaks v5 too, but the delivery tests run v5 over
    native only. Resolved when the config is read; the start-up log names the one in use."""
    host: str = field(init=False, default="", metadata={"doc": False})
    port: int = field(init=False, default=0, metadata={"doc": False})
    tls_implied: bool = field(init=False, default=False, metadata={"doc": False})
    """TLS is on because the broker is `mqtts://`, not because `tls` was set."""

    def __post_init__(self) -> None:
        """Parse the broker once (ValueError when malformed); `mqtts://` without `tls` is TlsConfig();
        `transport: auto` resolved."""
        if self.transport == AUTO:
            object.__setattr__(self, "transport", auto_transport(self.protocol, self.qos))
        address = parse_broker(self.broker, tls=self.tls is not None)
        object.__setattr__(self, "host", address.host)
        object.__setattr__(self, "port", address.port)
        if address.tls and self.tls is None:
            object.__setattr__(self, "tls", TlsConfig())
            object.__setattr__(self, "tls_implied", True)

    @property
    def url(self) -> str:
        """`mqtt(s)://host:port`, for logs."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'mqtts' if self.tls else 'mqtt'}://{host}:{self.port}"

    @property
    def is_v5(self) -> bool:
        return self.protocol == 5

    @property
    def persistent(self) -> bool:
        return self.session_expiry_s > 0

    def subscription(self, topic_filter: str) -> str:
        """The filter as subscribed: `$share/<group>/<filter>` in a share group, but for the fleet's
        topics: those are meant for every member, and a shared subscription gets no retained
        message (MQTT 5.0, 4.8.2), which the desired documents are."""
        if not self.share_group or topic_filter.startswith(FLEET_TOPICS) or topic_filter == self.fleet_cmd_topic:
            return topic_filter
        return f"$share/{self.share_group}/{topic_filter}"

    @property
    def fleet_cmd_topic(self) -> str:
        """Commands to this node's fleet agent (docs/fleet.md); not retained."""
        return f"edge-inferd/{self.client_id}/fleet/cmd"

    @property
    def fleet_reported_topic(self) -> str:
        """This node's retained fleet report (docs/fleet.md)."""
        return f"edge-inferd/{self.client_id}/fleet/reported"

    @property
    def fleet_desired_topic(self) -> str:
        """This node's own retained desired document (docs/fleet.md)."""
        return f"{FLEET_TOPICS}desired/node/{self.client_id}"

    @property
    def status_topic(self) -> str:
        return f"edge-inferd/{self.client_id}/status"

    @property
    def stats_topic(self) -> str:
        return f"edge-inferd/{self.client_id}/stats"

    @property
    def escalation_topic(self) -> str:
        """Where far tiers answer this daemon's `escalate.to_topic` requests (daemon/serve/cascade.py)."""
        return f"edge-inferd/{self.client_id}/escalations"

    def with_broker(self, broker: str) -> "MqttConfig":
        """A copy at another broker; TLS implied by the old `mqtts://` does not carry over."""
        return replace(self, broker=broker, tls=None if self.tls_implied else self.tls)


def wants_retained(topic: str) -> bool:
    """Whether the retained messages of a topic (or filter) are taken: the fleet's desired documents
    are retained on purpose; anything else retained is not a request (transport/mqtt.py)."""
    return topic.startswith(FLEET_TOPICS)


def fleet_group_topic(group: str) -> str:
    """A group's retained desired document (docs/fleet.md)."""
    return f"{FLEET_TOPICS}desired/group/{group}"


def parse_broker(value: str, tls: bool = False) -> BrokerAddress:
    """`host`, `host:port`, `[v6]:port`, `[v6]`, `mqtt://host[:port]` or `mqtts://host[:port]`.

    `tls`: the `tls` section is set (the default port is then 8883, as for `mqtts://`).
    ValueError, with a message meant for the user, on anything else."""
    if not isinstance(value, str) or not value:
        raise ValueError("must be a broker address such as localhost:1883 or mqtts://broker.example.com")
    scheme, sep, rest = value.partition("://")
    if not sep:
        scheme, rest = "", value
    elif scheme.lower() not in SCHEMES:
        raise ValueError(f"{value!r}: unknown scheme {scheme + '://'!r} (use mqtt://, mqtts:// or none)")
    scheme = scheme.lower()
    if scheme == "mqtt" and tls:
        raise ValueError(f"{value!r} is plain TCP, but mqtt.tls is set: use mqtts:// or leave the scheme out")
    host, port = _split_host_port(value, rest)
    secure = scheme == "mqtts" or tls
    return BrokerAddress(host, port or (DEFAULT_TLS_PORT if secure else DEFAULT_PORT), secure)


def _split_host_port(value: str, rest: str) -> tuple[str, Optional[int]]:
    if "://" in rest or "@" in rest or any(c in rest for c in "/?# \t"):
        what = ("a second scheme" if "://" in rest else "a user name (use mqtt.username and mqtt.password_file)"
                if "@" in rest else "a path or spaces")
        raise ValueError(f"{value!r} has {what}: give only host[:port]")
    if rest.startswith("["):
        inside, bracket, after = rest[1:].partition("]")
        if not bracket or after[:1] not in ("", ":") or not _is_ipv6(inside):
            raise ValueError(f"{value!r}: brackets hold an IPv6 address, as in [::1] or [::1]:1883")
        host, port = inside, after[1:] if after else None
    elif rest.count(":") > 1:
        raise ValueError(f"{value!r}: an IPv6 address goes in brackets, as [::1] or [::1]:1883")
    else:
        host, sep, port = rest.partition(":")
        port = port if sep else None
        if not _HOSTNAME.fullmatch(host):
            raise ValueError(f"{value!r}: {host!r} is not a host name or address")
    if port is not None and not (port.isdigit() and 0 < int(port) < PORT_LIMIT):
        raise ValueError(f"{value!r}: the port must be a number in 1..{PORT_LIMIT - 1}")
    return host, None if port is None else int(port)


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def read_mqtt(r: Reader, m: Mapping, base: Path) -> MqttConfig:
    p, d = "mqtt", MqttConfig
    tls = _read_tls(r, m, base)
    protocol = r.get(m, "protocol", p, (int, float, str), "5")
    if str(protocol) not in PROTOCOLS:
        r.error(m, "protocol", p, f"must be 5 or 3.1.1, got {protocol!r}")
    password, password_file = _read_password(r, m, base)
    return MqttConfig(
        broker=_read_broker(r, m, tls),
        client_id=r.get(m, "client_id", p, (str, type(None)), None, check=_no_wildcards) or default_client_id(),
        share_group=r.get(m, "share_group", p, (str, type(None)), None, check=_one_level),
        protocol=PROTOCOLS.get(str(protocol), 5),
        qos=r.get(m, "qos", p, int, d.qos, choices=(0, 1, 2)),
        keepalive_s=r.get(m, "keepalive_s", p, int, d.keepalive_s, minimum=5),
        reconnect_min_s=r.get(m, "reconnect_min_s", p, int, d.reconnect_min_s, minimum=1),
        reconnect_max_s=r.get(m, "reconnect_max_s", p, int, d.reconnect_max_s, minimum=1),
        session_expiry_s=r.get(m, "session_expiry_s", p, int, d.session_expiry_s, minimum=0,
                               check=_within_session_expiry),
        username=r.get(m, "username", p, (str, type(None)), None),
        password=password,
        password_file=password_file,
        tls=tls,
        outbox=_read_outbox(r, m, base),
        transport=_read_transport(r, m, str(protocol), m.get("qos", d.qos)),
    )


def auto_transport(protocol: int, qos: object) -> str:
    """One transport per protocol: native for MQTT v5 (QoS 0 or 1, where its package is installed), else paho."""
    native = protocol == 5 and qos != 2 and importlib.util.find_spec(NATIVE_PACKAGE) is not None
    return NATIVE if native else PAHO


def _read_transport(r: Reader, m: Mapping, protocol: str, qos: object) -> str:
    """`auto`, `paho` or `native`; native speaks MQTT v5 only, QoS 0 or 1, and needs its package."""
    transport = r.get(m, "transport", "mqtt", str, MqttConfig.transport, choices=TRANSPORTS)
    if transport != NATIVE:
        return transport
    if PROTOCOLS.get(protocol, 5) != 5:
        r.error(m, "transport", "mqtt", "native speaks MQTT v5 only: set protocol: 5, or transport: paho for 3.1.1")
    if qos == 2:
        r.error(m, "transport", "mqtt", "native does QoS 0 and 1 only: set qos: 1, or transport: paho for QoS 2")
    if importlib.util.find_spec(NATIVE_PACKAGE) is None:
        r.error(m, "transport", "mqtt", f"native needs the {NATIVE_PACKAGE} package, which is not installed: "
                "pip install mqtt5 (CPython >= 3.11; wheels for x86-64, aarch64 and armv7), or transport: paho")
    return transport


def _read_broker(r: Reader, m: Mapping, tls: Optional[TlsConfig]) -> str:
    broker = r.get(m, "broker", "mqtt", str, MqttConfig.broker)
    try:
        parse_broker(broker, tls=tls is not None)
    except ValueError as exc:
        r.error(m, "broker", "mqtt", str(exc))
        return MqttConfig.broker
    return broker


def _read_password(r: Reader, m: Mapping, base: Path) -> tuple[Optional[str], Optional[Path]]:
    """(password, the file it came from): inline, else password_file, else systemd's credential."""
    inline = r.get(m, "password", "mqtt", (str, type(None)), None)
    path = r.get(m, "password_file", "mqtt", (str, type(None)), None)
    if inline is not None and path is not None:
        r.error(m, "password_file", "mqtt", "set either password or password_file, not both")
    if path is None:
        credentials = os.environ.get("CREDENTIALS_DIRECTORY")
        candidate = Path(credentials) / CREDENTIAL_NAME if credentials else None
        if inline is not None or candidate is None or not candidate.is_file():
            return inline, None
        path = str(candidate)
    try:
        return (base / path).read_text(encoding="utf-8").rstrip("\r\n"), base / path
    except (OSError, UnicodeDecodeError) as exc:
        r.error(m, "password_file", "mqtt", f"cannot read {base / path}: {getattr(exc, 'strerror', None) or exc}")
        return None, None


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
    return OutboxConfig(
        dir=systemd_base("STATE_DIRECTORY", base) / r.get(o, "dir", "mqtt.outbox", str, str(d.dir)),
        max_mb=r.get(o, "max_mb", "mqtt.outbox", float, d.max_mb, minimum=0),
        broker_window=r.get(o, "broker_window", "mqtt.outbox", int, d.broker_window, minimum=0),
    )


def _within_session_expiry(value: int) -> Optional[str]:
    return None if value <= MAX_SESSION_EXPIRY_S else f"must be <= {MAX_SESSION_EXPIRY_S} (MQTT's 32-bit limit)"


def _one_level(value: Optional[str]) -> Optional[str]:
    return _level_error(value, "one non-empty topic level", "it goes into $share/<group>/<filter>")


def _no_wildcards(value: Optional[str]) -> Optional[str]:
    return _level_error(value, "non-empty", "it is part of the status topic")


def _level_error(value: Optional[str], what: str, why: str) -> Optional[str]:
    """A value that becomes one topic level: not empty, no wildcard, no separator."""
    if value is not None and (not value or any(c in value for c in "+#/")):
        return f"must be {what} without '+', '#' or '/' ({why})"
    return None
