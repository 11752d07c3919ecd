"""A private rumqttd (the Rust broker) on a free loopback port, for tests that need a second broker.

rumqttd 0.20 ships inside the PyPI package `iotcore` 0.4 (`pip install -e '.[test]'`, Linux x86-64):
`python -m iotcore --config mqtt.toml` runs it in that process until SIGTERM. Same surface as
`daemon.tools.broker.Broker`, but what the two brokers guarantee differs:

- No disk persistence: a restart (even a clean SIGTERM) loses every session, its
  subscriptions and its queued messages. A persistent client must subscribe again.
- `$share/` groups: rumqttd's default strategy is already round robin; it is written out so
  the file says what the tests rely on.
- `max_payload_size`: rumqttd's default, 20 KB, would refuse the bundled camera images;
  a larger PUBLISH closes the sender's connection.
- Outgoing QoS 1: rumqttd 0.20 writes up to 100 unacked PUBLISHes per client, a constant in
  its router (`router/iobufs.rs`, MAX_INFLIGHT), whatever `max_inflight_count` or the client's
  ReceiveMaximum say (tools/dev/probe_rumqttd.py receive_maximum). The rest waits in the router's
  commit log (`max_segment_size` x `max_segment_count` per topic filter, oldest segment dropped
  past it), which is sized so a 5,000-request burst waits there instead of being dropped.
- PUBACKs must come in order (as MQTT says they must): an out-of-order one is logged ("out of
  order ack"). The daemon acked a request once its reply was confirmed, so out of order, and a
  5,000-request burst stalled after 296-956 replies; it now acks in order (transport/ack_order.py).
- While its 100 messages to a client are unacked, rumqttd confirms none of that client's own
  publishes (tools/dev/probe_rumqttd.py full_window: a reply published with a backlog of 50 is
  PUBACKed, with 150 it is not). The daemon acks a request only once its reply's PUBACK is back,
  so a backlog of 100 or more at the daemon deadlocks: the tests that build one skip rumqttd.
- Retain As Published and Retain Handling are ignored: a retained publish (or a retained clear)
  reaches existing subscribers without the retain flag, so the daemon answers it as a request.
- A PUBLISH over `max_payload_size` closes the sender's connection with no DISCONNECT reason,
  and CONNACK announces no Maximum Packet Size: paho resends it after each reconnect.

Only a `[v5.1]` listener is written: rumqttd picks the protocol per listener, and every client
here (daemon, tests) speaks v5. A 3.1.1 CONNECT on the v5 port is dropped without a CONNACK, so
`protocol_v4=True` adds a `[v4.1]` listener on a second port (`.port_v4`) for `mqtt.protocol: 3.1.1`.

`settings` takes mosquitto's TLS keys, translated to rumqttd's `[v5.1.tls]`: `certfile` and
`keyfile` (server TLS); `cafile` only counts with `require_certificate: "true"`, as in mosquitto,
because rumqttd then demands a client certificate signed by it. `users: {name: password}`
turns on rumqttd's plain-text `auth` table (anonymous clients are then refused).
"""

from __future__ import annotations

import importlib.util
import socket
import sys
from pathlib import Path
from typing import Optional

from daemon.errors import DaemonError
from daemon.tools.broker import LOOPBACK, BrokerProcess, free_port

# Bytes in one PUBLISH payload; rumqttd's default (20 KB) refuses camera frames.
MAX_PAYLOAD_SIZE = 4 * 1024 * 1024
# rumqttd's per-connection inflight setting; its outgoing window stays 100 whatever this says.
MAX_INFLIGHT_COUNT = 1000
# Packets the router reads from the log for one connection per turn.
MAX_OUTGOING_PACKET_COUNT = 1000
# One topic filter's commit log: segments of this size, this many kept (older ones are dropped).
MAX_SEGMENT_SIZE = 100 * 1024 * 1024
MAX_SEGMENT_COUNT = 10
MAX_CONNECTIONS = 10_010
# Time a new connection has to send CONNECT.
CONNECTION_TIMEOUT_MS = 60_000
# rumqttd enters an `error_span!` per packet, so at ERROR Python logging writes 2-4 lines per
# message (and takes the GIL for each); CRITICAL keeps the log to iotcore's start-up line.
QUIET = "CRITICAL"
_TLS_KEYS = {"certfile", "keyfile", "cafile", "require_certificate"}
_KEYS = _TLS_KEYS | {"users"}


def find_rumqttd() -> list[str]:
    """The command line that runs rumqttd, or a DaemonError that says how to install it."""
    if importlib.util.find_spec("iotcore") is None:
        raise DaemonError("rumqttd is not installed: pip install 'iotcore==0.4.*' (in the test extra, "
                          "pip install -e '.[test]', on Linux x86-64 only: iotcore 0.4 has no aarch64 or "
                          "armv7 wheels, and its sdist needs a Rust toolchain)")
    return [sys.executable, "-m", "iotcore"]


def _check_free(port: int) -> None:
    """rumqttd exits only after a moment when its port is taken, and until then the readiness
    check would connect to whoever holds it; SO_REUSEADDR so a restart's TIME_WAIT does not count."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError as exc:
            raise DaemonError(f"rumqttd cannot listen on {LOOPBACK}:{port}: {exc.strerror}") from exc


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _table(name: str, values: dict) -> list[str]:
    return [f"[{name}]"] + [f"{key} = {_toml(value)}" for key, value in values.items()] + [""]


class Rumqttd(BrokerProcess):
    """`with Rumqttd() as b: ... b.address`; `stop()` / `kill()` / `start()` may be repeated."""

    name = "rumqttd"
    log_name = "rumqttd.log"
    username: Optional[str] = None
    password: Optional[str] = None

    def __init__(self, workdir: Optional[Path] = None, port: Optional[int] = None,
                 settings: Optional[dict] = None, protocol_v4: bool = False, log_level: str = QUIET):
        """`log_level: "ERROR"` shows why rumqttd dropped a connection, among a line per packet."""
        super().__init__(workdir, port, settings)
        self.log_level = log_level
        unknown = set(self._settings) - _KEYS
        if unknown:
            raise DaemonError(f"rumqttd settings: unknown {sorted(unknown)}; known: {sorted(_KEYS)}")
        self.port_v4: Optional[int] = free_port() if protocol_v4 else None
        users = dict(self._settings.get("users") or {})
        if users:  # the first user, for a test that needs one login
            self.username, self.password = next(iter(users.items()))

    def _command(self) -> list[str]:
        command = find_rumqttd()
        for port in (self.port, self.port_v4):
            if port is not None:
                _check_free(port)
        self.workdir.mkdir(parents=True, exist_ok=True)
        conf = self.workdir / "mqtt.toml"
        conf.write_text(self.config_text())
        return command + ["--config", str(conf), "--log-level", self.log_level]

    def config_text(self) -> str:
        router = {
            "max_connections": MAX_CONNECTIONS,
            "max_outgoing_packet_count": MAX_OUTGOING_PACKET_COUNT,
            "max_segment_size": MAX_SEGMENT_SIZE,
            "max_segment_count": MAX_SEGMENT_COUNT,
            "shared_subscriptions_strategy": "roundrobin",
        }
        lines = ["id = 0", ""] + _table("router", router)
        lines += self._listener("v5.1", self.port)
        if self.port_v4 is not None:
            lines += self._listener("v4.1", self.port_v4)
        return "\n".join(lines)

    def _listener(self, key: str, port: int) -> list[str]:
        server = {"name": key.replace(".", "-"), "listen": f"{LOOPBACK}:{port}", "next_connection_delay_ms": 0}
        connections = {
            "connection_timeout_ms": CONNECTION_TIMEOUT_MS,
            "max_payload_size": MAX_PAYLOAD_SIZE,
            "max_inflight_count": MAX_INFLIGHT_COUNT,
            "dynamic_filters": True,
        }
        lines = _table(key, server) + _table(f"{key}.connections", connections)
        users = self._settings.get("users")
        if users:
            lines += _table(f"{key}.connections.auth", dict(users))
        tls = self._tls()
        if tls:
            lines += _table(f"{key}.tls", tls)
        return lines

    def _tls(self) -> dict[str, str]:
        given = {key: self._settings[key] for key in _TLS_KEYS if key in self._settings}
        if not given:
            return {}
        if "certfile" not in given or "keyfile" not in given:
            raise DaemonError("rumqttd settings: TLS needs both certfile and keyfile")
        tls = {"certpath": str(given["certfile"]), "keypath": str(given["keyfile"])}
        if str(given.get("require_certificate", "false")).lower() == "true":
            if "cafile" not in given:
                raise DaemonError("rumqttd settings: require_certificate needs cafile")
            tls["capath"] = str(given["cafile"])
        # rumqttd listens without its certificate and names it only when a client connects.
        missing = [path for path in tls.values() if not Path(path).is_file()]
        if missing:
            raise DaemonError(f"rumqttd settings: TLS file(s) not found: {', '.join(missing)}")
        return tls
