"""A real Home Assistant as a process, for the discovery tests (its venv: scripts/setup_ha.sh).

`HomeAssistant` writes a minimal config dir: `http` and `api` on a free port, `auth` for the
login flow, and the MQTT integration as a config entry in `.storage/core.config_entries`
(HA 2024 sets MQTT up only through its config flow, never from YAML: the entry is what the UI
would have written), pointed at the test's broker with discovery on. A user is added offline
with HA's own `--script auth`, and the test logs in through the REST login flow to get an
access token for `/api/states`. HA runs with `--skip-pip`: it never reaches the network.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Callable, Optional

from daemon.tools.broker import end_process, free_port

ROOT = Path(__file__).resolve().parents[2]
HA_PYTHON = Path(os.environ.get("EDGE_INFERD_HA_PYTHON", ROOT / ".cache" / "ha-venv" / "bin" / "python"))
READY_MARK = "edge-inferd-ha-ready"  # scripts/setup_ha.sh writes it once the venv is complete
USER, PASSWORD = "edge", "edge-inferd-test"
START_TIMEOUT_S = 180.0  # HA's first start compiles its translations and makes .storage
POLL_S = 0.25
HTTP_TIMEOUT_S = 10.0
_OK = 200


def available() -> Optional[str]:
    """Why the HA tests cannot run here, or None when they can."""
    if not (HA_PYTHON.parent.parent / READY_MARK).exists():
        return (f"no finished Home Assistant venv at {HA_PYTHON.parent.parent}: run ./scripts/setup_ha.sh "
                "(about 2 min and 570 MB, once)")
    return None


def _config_entry(broker_port: int, prefix: str) -> dict:
    entry = {"entry_id": "0123456789abcdef0123456789abcdef", "version": 1, "minor_version": 1, "domain": "mqtt",
             "title": "test broker", "data": {"broker": "127.0.0.1", "port": broker_port, "discovery": True,
                                              "discovery_prefix": prefix},
             "options": {}, "pref_disable_new_entities": False, "pref_disable_polling": False, "source": "user",
             "unique_id": None, "disabled_by": None}
    return {"version": 1, "minor_version": 1, "key": "core.config_entries", "data": {"entries": [entry]}}


_AUTH_FILE = "auth_provider.homeassistant"  # what `--script auth add` writes: the user and its bcrypt hash
_auth_written: list[bytes] = []  # that file, once made in this process


def _add_user(config_dir: Path) -> None:
    """The test user, added offline by HA's own `--script auth add` (a start of HA's Python, ~2.5 s)
    the first time in a test run; every later instance gets a copy of the file it wrote."""
    target = config_dir / ".storage" / _AUTH_FILE
    if not _auth_written:
        subprocess.run([str(HA_PYTHON), "-m", "homeassistant", "--script", "auth", "-c", str(config_dir),
                        "add", USER, PASSWORD], check=True, capture_output=True, timeout=120)
        _auth_written.append(target.read_bytes())
        return
    target.write_bytes(_auth_written[0])
    target.chmod(0o600)


class HomeAssistant:
    def __init__(self, config_dir: Path, broker_port: int, prefix: str = "homeassistant"):
        self.dir = config_dir
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / ".storage").mkdir(exist_ok=True)
        (self.dir / "configuration.yaml").write_text(
            "homeassistant:\n  name: edge-inferd test\n  time_zone: UTC\n  unit_system: metric\n"
            "  latitude: 0\n  longitude: 0\n  elevation: 0\n"
            f"http:\n  server_host: 127.0.0.1\n  server_port: {self.port}\n"
            "api:\nauth:\nlogger:\n  default: warning\n  logs:\n    homeassistant.components.mqtt: info\n")
        (self.dir / ".storage" / "core.config_entries").write_text(json.dumps(_config_entry(broker_port, prefix)))
        _add_user(self.dir)
        self.log_path = self.dir / "ha.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([str(HA_PYTHON), "-m", "homeassistant", "--config", str(self.dir),
                                      "--skip-pip", "--log-file", str(self.dir / "home-assistant.log")],
                                     stdout=self._log, stderr=subprocess.STDOUT)
        self.token = ""

    def start(self) -> "HomeAssistant":
        """Wait for the API (401 without a token means HA is up), then log in."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"Home Assistant exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                urllib.request.urlopen(f"{self.base}/api/", timeout=HTTP_TIMEOUT_S)
            except urllib.error.HTTPError as exc:
                if exc.code == 401:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"Home Assistant did not serve its API in {START_TIMEOUT_S:.0f} s:\n"
                                   f"{self.log()[-3000:]}")
            time.sleep(POLL_S)
        self.token = self._login()
        return self

    def _post(self, path: str, body: dict, form: bool = False) -> dict:
        data = urllib.parse.urlencode(body).encode() if form else json.dumps(body).encode()
        kind = "application/x-www-form-urlencoded" if form else "application/json"
        request = urllib.request.Request(f"{self.base}{path}", data=data, headers={"Content-Type": kind})
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
            return json.loads(response.read())

    def _login(self) -> str:
        """HA's login flow, as its frontend runs it: a flow, the user's password, a code, a token."""
        client = f"{self.base}/"
        flow = self._post("/auth/login_flow", {"client_id": client, "handler": ["homeassistant", None],
                                               "redirect_uri": client})
        done = self._post(f"/auth/login_flow/{flow['flow_id']}",
                          {"client_id": client, "username": USER, "password": PASSWORD})
        assert done.get("type") == "create_entry", done
        token = self._post("/auth/token", {"grant_type": "authorization_code", "code": done["result"],
                                           "client_id": client}, form=True)
        return token["access_token"]

    def states(self) -> dict[str, dict]:
        """Every entity's state object from the REST API, by entity id."""
        request = urllib.request.Request(f"{self.base}/api/states",
                                         headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
            assert response.status == _OK
            return {state["entity_id"]: state for state in json.loads(response.read())}

    def _authorized(self, path: str, body: dict) -> bytes:
        request = urllib.request.Request(f"{self.base}{path}", data=json.dumps(body).encode(),
                                         headers={"Authorization": f"Bearer {self.token}",
                                                  "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
            assert response.status == _OK
            return response.read()

    def call_service(self, domain: str, service: str, data: dict) -> list:
        """`POST /api/services/<domain>/<service>`: the states it changed (HA answers 400 on a refusal)."""
        return json.loads(self._authorized(f"/api/services/{domain}/{service}", data))

    def render(self, template: str) -> str:
        """A template rendered by HA (`POST /api/template`): what the states API does not show (devices)."""
        return self._authorized("/api/template", {"template": template}).decode()

    def wait_for(self, what: str, predicate: Callable[[dict], bool], timeout_s: float = 60.0) -> dict:
        """The states once `predicate(states)` holds; the last states and HA's log in the failure."""
        deadline = time.monotonic() + timeout_s
        while True:
            states = self.states()
            if predicate(states):
                return states
            if time.monotonic() > deadline:
                shown = {k: (v["state"], v["attributes"]) for k, v in states.items() if "edge_inferd" in k}
                raise AssertionError(f"Home Assistant: {what} not seen in {timeout_s:.0f} s; "
                                     f"states {shown}\nlog:\n{self.log()[-4000:]}")
            time.sleep(POLL_S)

    def log(self) -> str:
        path = self.dir / "home-assistant.log"
        return path.read_text(errors="replace") if path.exists() else self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """SIGKILL: nothing is judged after a test, and HA's own shutdown (its integrations, its
        .storage written out) took ~2.5 s of each test's teardown; its config dir is the test's."""
        end_process(self.proc, signal.SIGKILL)
        self._log.close()
