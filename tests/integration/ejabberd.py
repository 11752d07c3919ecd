"""A private ejabberd (its `mod_mqtt`) on a free loopback port: a second broker for the tests.

Same surface as `daemon.tools.broker.Broker`. ejabberd 23.01 (Debian `ejabberd`) differs
from mosquitto where it matters to the daemon (tools/dev/probe_ejabberd.py shows each):
- Sessions live in RAM tables only (`mqtt_session`, `mqtt_sub`): a broker stop or SIGKILL
  ends every session and loses every queued message; CONNACK then says session-present 0.
- Session expiry is granted up to mod_mqtt's `session_expiry` (default 5 minutes): a
  request for 86,400 s gets 300 in CONNACK. Raise it with
  `settings={"modules": {"mod_mqtt": {"session_expiry": 86400}}}`.
- One QoS 1/2 message in flight per session, whatever ReceiveMaximum says.
- An offline session past `max_queue` (5,000) is cleared and ended: all of it is lost.
- Message expiry is checked for queued messages, not for the one in flight when the
  client vanished: that one is redelivered with its original interval, even if expired.
- A `$share/...` SUBSCRIBE gets DISCONNECT 0x9E, not a SUBACK; a takeover DISCONNECT 0x8E.
- No Maximum Packet Size in CONNACK: the listener's `max_payload_size` is enforced with
  DISCONNECT 0x95, and a client's own Maximum Packet Size is ignored.

How it runs, and why:
- `erl` directly, not `ejabberdctl`: started as root, ejabberdctl re-runs itself as the
  `ejabberd` user (`su`), which cannot write a 0700 temporary directory, and it names
  a node, which needs epmd and a cookie.
- Erlang distribution off (no `-sname`): the VM is `nonode@nohost`, starts no epmd,
  opens no distribution port and needs no cookie, so it cannot clash with a system
  ejabberd (`ejabberd@localhost`) or another test's instance. Nothing can attach to
  it with `ejabberdctl` either, hence anonymous logins instead of registered users.
- `auth_method: anonymous` with `anonymous_protocol: login_anon`: mod_mqtt then accepts
  any user name with a non-empty password. It refuses a CONNECT without a user name
  (CONNACK 0x87), so clients still send `username`/`password`.
- Only the mod_mqtt listener, on 127.0.0.1; mnesia spool, log and crash dump in `workdir`.
"""

from __future__ import annotations

import glob
import os
import shutil
from pathlib import Path
from typing import Any, Optional

import yaml

from daemon.errors import DaemonError
from daemon.tools.broker import LOOPBACK, BrokerProcess

# A cold start (empty spool) takes about 1 s on an idle 2-core machine; the limit is for a loaded one.
_READY_TIMEOUT_S = 60.0
# ejabberd flushes mnesia and stops its listeners on SIGTERM; give it time before the SIGKILL.
_STOP_TIMEOUT_S = 20.0
_ERL_CANDIDATES = ("erl", "/usr/bin/erl", "/usr/lib/erlang/bin/erl")
# Where Debian's package puts its OTP application (ejabberdctl sets ERL_LIBS to the parent).
_EJABBERD_APP_GLOBS = ("/usr/lib/*/ejabberd-[0-9]*", "/usr/lib/erlang/lib/ejabberd-[0-9]*")
_LOG_NAME = "ejabberd.log"
_CONSOLE_NAME = "erl.out"
USERNAME = "gw1@localhost"
PASSWORD = "secret"


def find_ejabberd() -> tuple[str, str]:
    """(the `erl` executable, the directory to use as ERL_LIBS); DaemonError when either is missing."""
    erl = next((found for found in map(shutil.which, _ERL_CANDIDATES) if found), None)
    apps = sorted(path for pattern in _EJABBERD_APP_GLOBS for path in glob.glob(pattern)
                  if os.path.isfile(os.path.join(path, "ebin", "mod_mqtt.beam")))
    if erl is None or not apps:
        raise DaemonError("ejabberd is not installed: apt-get install ejabberd (./scripts/setup.sh does this)")
    return erl, os.path.dirname(apps[-1])


def _merge(base: dict, extra: dict) -> dict:
    """`base` updated by `extra`, nested dicts merged, anything else replaced."""
    merged = dict(base)
    for key, value in extra.items():
        merged[key] = _merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) \
            else value
    return merged


class Ejabberd(BrokerProcess):
    """`with Ejabberd() as b: ... b.address`; `stop()` / `kill()` / `start()` may be repeated.

    Clients must connect with `username`/`password` (any name works; the pair is a fixed one)."""

    name = "ejabberd"
    log_name = _CONSOLE_NAME  # erl's console; ejabberd's own log is `log_path`
    ready_timeout_s = _READY_TIMEOUT_S
    stop_timeout_s = _STOP_TIMEOUT_S
    username = USERNAME
    password = PASSWORD

    def __init__(self, workdir: Optional[Path] = None, port: Optional[int] = None,
                 settings: Optional[dict[str, Any]] = None):
        """`settings` are merged into ejabberd.yml; `listen` (a dict) into the mod_mqtt listener,
        e.g. `{"modules": {"mod_mqtt": {"session_expiry": 60}}, "listen": {"max_payload_size": 1024}}`."""
        super().__init__(workdir, port, settings)
        self._offset = 0

    @property
    def log_path(self) -> Path:
        return self.workdir / _LOG_NAME

    def config(self) -> dict:
        """The ejabberd.yml written at each start, as a dict."""
        listener = {"port": self.port, "ip": LOOPBACK, "module": "mod_mqtt", "backlog": 1000}
        extra = dict(self._settings)
        listener.update(extra.pop("listen", {}))
        base = {
            "hosts": ["localhost"],
            "loglevel": "info",
            "log_rotate_count": 0,
            "auth_method": ["anonymous"],
            "anonymous_protocol": "login_anon",
            # No certificates to fetch: without this ejabberd would try ACME for its hosts.
            "acme": {"auto": False},
            "listen": [listener],
            "modules": {"mod_mqtt": {}},
        }
        return _merge(base, extra)

    def _write_config(self) -> Path:
        (self.workdir / "spool").mkdir(parents=True, exist_ok=True)
        conf = self.workdir / "ejabberd.yml"
        conf.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        return conf

    def _command(self) -> list[str]:
        erl, self._libs = find_ejabberd()
        self._conf = self._write_config()
        self._offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        # The mnesia dir is an Erlang string term, hence the inner quotes. erl execs erlexec, which
        # execs beam.smp: the child's pid is the VM's, so signals reach it.
        return [erl, "+K", "true", "-noinput", "-noshell", "-mnesia", "dir", f'"{self.workdir / "spool"}"',
                "-s", "ejabberd"]

    def _env(self) -> dict[str, str]:
        return {**os.environ, "EJABBERD_CONFIG_PATH": str(self._conf), "EJABBERD_LOG_PATH": str(self.log_path),
                "ERL_LIBS": self._libs, "ERL_CRASH_DUMP": str(self.workdir / "erl_crash.dump"),
                "ERL_CRASH_DUMP_BYTES": "0", "HOME": str(self.workdir)}

    def _ready(self) -> bool:
        """Our VM says it listens on our port (another process may hold a port free_port chose)."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._offset)
                text = log.read().decode(errors="replace")
        except FileNotFoundError:
            return False
        return f"Start accepting TCP connections at {LOOPBACK}:{self.port} for mod_mqtt" in text
