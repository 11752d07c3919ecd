"""Integration fixtures: a real mosquitto on a free port and the real daemon as a process.

No broker mocks, no fake interpreters: every test here goes through paho, mosquitto,
the daemon's CLI and the bundled INT8 models. Waits are event-driven with generous
time limits (a limit only decides how long a failing test takes, never whether it passes).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import paho.mqtt.client as paho
import pytest
import yaml
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from daemon.obs.stats_topic import stopped_stats
from daemon.tools.broker import Broker, end_process
from tests.integration import brokers, v2_servers
from daemon.config.reader import absolute_paths
from daemon.transport.mqtt import disable_nagle, stop_loop

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 60.0
# The transports a delivery test runs over, one per protocol: native for MQTT v5 (on every broker),
# paho for 3.1.1 (on mosquitto; write_config sets the protocol with it).
NATIVE, PAHO = "native", "paho"
TRANSPORTS = [
    pytest.param(NATIVE, marks=pytest.mark.skipif(
        importlib.util.find_spec("mqtt5") is None,
        reason="mqtt.transport: native needs the mqtt5 package (a default dependency on CPython >= 3.11)")),
    pytest.param(PAHO, id="paho-3.1.1"),
]


@pytest.fixture(params=TRANSPORTS)
def transport(request) -> str:
    """The `mqtt.transport` a delivery test runs over (pass it to write_config): native on MQTT v5,
    or paho on 3.1.1. A test of what only v5 carries takes no `transport`: it runs on the default."""
    return request.param


def pytest_generate_tests(metafunc):
    """A test marked `brokers(*features)` runs on every broker of brokers.KINDS (skipped with the
    reason where one is missing or lacks a feature)."""
    marker = metafunc.definition.get_closest_marker("brokers")
    if marker is None or "broker" not in metafunc.fixturenames:
        return
    metafunc.parametrize("broker", brokers.params(*marker.args), indirect=True)


def pytest_collection_modifyitems(items):
    """The other brokers run the v5 transport (native); paho's 3.1.1 runs on mosquitto (brokers.py)."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or callspec.params.get("broker", brokers.MOSQUITTO) == brokers.MOSQUITTO:
            continue
        if callspec.params.get("transport") == PAHO:
            item.add_marker(pytest.mark.skip(reason=brokers.PAHO_ON_MOSQUITTO))


@pytest.fixture
def broker(request, tmp_path):
    """mosquitto, or the broker a `brokers`-marked test is parametrized with; `.kind` names it."""
    name = getattr(request, "param", brokers.MOSQUITTO)
    with brokers.KINDS[name].make(tmp_path / "broker") as b:
        b.kind = name
        yield b
        b.kill()  # the test is over (its daemons stopped first): a clean stop took ejabberd's VM ~1 s


class _Messages(list):
    """Every message in arrival order, and each topic's too (`by_topic`): a wait that counts one
    topic's messages at each arrival reads its own list, not every message so far (with thousands
    of replies on several topics, those rescans took more CPU than the daemons). The mutations
    tests make (`clear()`, `del messages[:]`) clear both."""

    def __init__(self):
        super().__init__()
        self.by_topic: dict[str, list] = {}

    def append(self, msg) -> None:
        super().append(msg)
        self.by_topic.setdefault(msg.topic, []).append(msg)

    def _reindex(self) -> None:
        self.by_topic = {}
        for msg in self:
            self.by_topic.setdefault(msg.topic, []).append(msg)

    def clear(self) -> None:
        super().clear()
        self.by_topic = {}

    def __delitem__(self, index) -> None:
        super().__delitem__(index)
        self._reindex()

    def __setitem__(self, index, value) -> None:
        super().__setitem__(index, value)
        self._reindex()

    def __iadd__(self, other):
        for msg in other:
            self.append(msg)
        return self

    def extend(self, other) -> None:
        for msg in other:
            self.append(msg)

    def insert(self, index, msg) -> None:
        super().insert(index, msg)
        self._reindex()

    def pop(self, index=-1):
        msg = super().pop(index)
        self._reindex()
        return msg

    def remove(self, msg) -> None:
        super().remove(msg)
        self._reindex()


class Client:
    """A test MQTT client that records every message per topic."""

    def __init__(self, broker: Broker, protocol: int = paho.MQTTv5, client_id: str = "", persistent: bool = False):
        """`persistent`: a v5 session the broker keeps across disconnects and its own restarts."""
        self.messages: _Messages = _Messages()
        self.cond = threading.Condition()
        self.c = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol)
        self.c.on_message = self._on_message
        self.topics: list[str] = []
        self.c.on_connect = self._on_connect
        if getattr(broker, "username", None):  # a broker that takes registered users only (ejabberd)
            self.c.username_pw_set(broker.username, broker.password)
        options: dict = {}
        if persistent:
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = 3600
            options = {"clean_start": False, "properties": props}
        self.c.connect("127.0.0.1", broker.port, **options)
        disable_nagle(self.c.socket())
        self.c.loop_start()

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        """Every reconnect subscribes again, as a real client should: rumqttd and ejabberd keep no
        session across their own restarts, and a SIGKILLed mosquitto restores its last autosave,
        which may predate a subscription (seen once under load: session present, nothing delivered)."""
        disable_nagle(client.socket())
        if self.topics:
            client.subscribe([(topic, 1) for topic in self.topics])

    def _on_message(self, client, userdata, msg) -> None:
        with self.cond:
            self.messages.append(msg)
            self.cond.notify_all()

    def subscribe(self, topic: str) -> None:
        done = threading.Event()
        self.c.on_subscribe = lambda *a: done.set()
        self.c.subscribe(topic, qos=1)
        assert done.wait(WAIT_S), f"subscription to {topic} not acknowledged"
        self.topics.append(topic)

    def publish(self, topic: str, payload: bytes, response_topic: Optional[str] = None,
                correlation: Optional[bytes] = None, qos: int = 1) -> None:
        props = None
        if response_topic or correlation:
            props = Properties(PacketTypes.PUBLISH)
            if response_topic:
                props.ResponseTopic = response_topic
            if correlation:
                props.CorrelationData = correlation
        self.c.publish(topic, payload, qos=qos, properties=props).wait_for_publish(WAIT_S)

    def on(self, topic: str) -> list:
        with self.cond:
            return list(self.messages.by_topic.get(topic, ()))

    def count(self, topic: str) -> int:
        """How many messages came on `topic` (len(on(topic)) without the copy)."""
        with self.cond:
            return len(self.messages.by_topic.get(topic, ()))

    def wait_count(self, topic: str, n: int) -> list:
        with self.cond:
            self.cond.wait_for(lambda: self.count(topic) >= n, WAIT_S)
        got = self.on(topic)
        assert len(got) >= n, f"expected {n} message(s) on {topic}, got {len(got)}"
        return got

    def wait_json(self, topic: str, n: int = 1) -> list[dict]:
        return [json.loads(m.payload) for m in self.wait_count(topic, n)]

    def wait_json_until(self, topic: str, predicate: Callable[[dict], bool]) -> dict:
        """The first JSON message on `topic` for which `predicate` holds (waiting for it); each
        message is parsed and judged once, as it comes."""
        looked = {"list": None, "n": 0}  # the topic's list and how many of it were judged
        found: list[dict] = []

        def first() -> bool:
            messages = self.messages.by_topic.get(topic, [])
            if messages is not looked["list"]:  # the first look, or the messages were cleared
                looked.update(list=messages, n=0)
            while looked["n"] < len(messages):
                payload = json.loads(messages[looked["n"]].payload)
                looked["n"] += 1
                if predicate(payload):
                    found.append(payload)
                    return True
            return False
        with self.cond:
            assert self.cond.wait_for(first, WAIT_S), f"nothing as wanted on {topic}: {self.on(topic)[-1:]}"
            return found[0]

    def wait_payload(self, topic: str, payload: bytes) -> None:
        def seen() -> bool:
            return any(m.payload == payload for m in self.messages.by_topic.get(topic, ()))
        with self.cond:
            assert self.cond.wait_for(seen, WAIT_S), f"no {payload!r} on {topic}"

    def close(self) -> None:
        self.c.disconnect()
        stop_loop(self.c)


class TimedClient(Client):
    """Records when each reply on a results/ topic arrived (time.monotonic), by its id."""

    def __init__(self, broker):
        self.arrived: dict[int, list[float]] = {}
        self.lock = threading.Lock()
        super().__init__(broker)

    def _on_message(self, client, userdata, msg) -> None:
        if msg.topic.startswith("results/"):
            with self.lock:
                self.arrived.setdefault(json.loads(msg.payload)["id"], []).append(time.monotonic())
        super()._on_message(client, userdata, msg)


@pytest.fixture
def client(broker):
    c = Client(broker)
    yield c
    c.close()


def activity_payloads(n: int) -> list[bytes]:
    """n requests for the activity model, ids 0..n-1, cycling through its test windows."""
    with np.load(ROOT / "models/activity/test.npz") as data:
        x = data["x"]
    return [json.dumps({"id": i, "data": np.round(x[i % len(x)], 3).tolist()}).encode() for i in range(n)]


def burst(client: Client, topic: str, payloads: list[bytes]) -> None:
    """Queue every publish at once (QoS 1), without waiting for each to be acknowledged."""
    infos = [client.c.publish(topic, p, qos=1) for p in payloads]
    for info in infos:
        info.wait_for_publish(WAIT_S)


def wait_unique_ids(client: Client, topic: str, n: int) -> list[dict]:
    """Every reply on `topic` once n distinct ids have been answered (or the wait ran out); each
    reply is parsed once, as it comes (parsing them all at every arrival was quadratic)."""
    replies: list[dict] = []
    ids: set = set()
    parsed_from: list = [None]  # the topic's list the replies were parsed from

    def enough() -> bool:
        messages = client.messages.by_topic.get(topic, [])
        if messages is not parsed_from[0]:  # the first look, or the messages were cleared
            parsed_from[0] = messages
            replies.clear()
            ids.clear()
        for m in messages[len(replies):]:
            replies.append(json.loads(m.payload))
            ids.add(replies[-1]["id"])
        return len(ids) >= n
    with client.cond:
        client.cond.wait_for(enough, WAIT_S)
        enough()
        return list(replies)


def write_config(tmp_path: Path, base: Path = ROOT / "config.yaml", transport: Optional[str] = None,
                 **overrides) -> Path:
    """A copy of a config with absolute model paths, a private cache, client id `edge-inferd`
    (unless the base config names one), `mqtt.transport` when given (paho with MQTT 3.1.1: one transport
    per protocol), and overrides per section."""
    raw = absolute_paths(yaml.safe_load(base.read_text()), base.parent)
    raw["cache"] = {**(raw.get("cache") or {}), "dir": str(tmp_path / "cache")}
    # The tests wait on edge-inferd/edge-inferd/status: pin the id (the default is edge-inferd-<hostname>).
    raw["mqtt"] = {"client_id": "edge-inferd", **(raw.get("mqtt") or {})}
    if transport is not None:
        raw["mqtt"]["transport"] = transport
        if transport == PAHO:
            raw["mqtt"]["protocol"] = "3.1.1"
    for section, values in overrides.items():
        raw[section] = {**(raw.get(section) or {}), **values} if isinstance(values, dict) else values
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


LARGE = ROOT / "models/appliance_large"
# appliance_large's own route (models/appliance_large/config.yaml) on this node's appliance topics:
# ~7.5 ms a trace, so a burst of them queues (and its results are worth a disk read).
LARGE_ROUTE = {"name": "appliance", "subscribe": "plugs/+/power", "model": "appliance_large",
               "input": {"format": "json", "shape": [1460], "dtype": "float32"},
               "preprocess": [{"standardize": {"axis": 0}}, {"clip": {"min": -3.0, "max": 3.0}},
                              {"reshape": {"shape": [1460, 1]}}],
               "output": {"top_k": 3}, "publish": "results/{1}/appliance"}
LARGE_MODELS = {"appliance_large": {"path": str(LARGE / "model.tflite"), "labels": str(LARGE / "labels.txt")}}


class Daemon:
    """`edge-inferd run` as a child process, with its log kept for failures."""

    def __init__(self, config: Path, broker_address: str, log: Path, env: Optional[dict] = None):
        self.log_path = log
        self._log = open(log, "wb")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc = subprocess.Popen([sys.executable, "-m", "daemon", "run", "--config", str(config),
                                      "--broker", broker_address], stdout=self._log, stderr=subprocess.STDOUT,
                                     env=env, cwd=ROOT)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        code = end_process(self.proc, sig, WAIT_S)
        self._log.close()
        return code

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def final_stats(self) -> dict:
        """The JSON stats of the daemon's last "stopped; stats {...}" log line."""
        stats = stopped_stats(self.log())
        assert stats is not None, self.log()[-2000:]
        return stats

    def wait_for_log(self, text: str, count: int = 1) -> bool:
        """Until `text` has appeared `count` times in the log (or the daemon exited)."""
        for _ in range(int(WAIT_S / 0.05)):
            if self.log().count(text) >= count or self.proc.poll() is not None:
                break
            time.sleep(0.05)  # polling a log file; the limit only bounds a failing test
        return self.log().count(text) >= count


def with_login(config: Path, broker) -> Path:
    """The config, given the broker's user and password when it takes registered users only (ejabberd)."""
    if getattr(broker, "username", None):
        raw = yaml.safe_load(config.read_text())
        raw["mqtt"] = {**(raw.get("mqtt") or {}), "username": broker.username, "password": broker.password}
        config.write_text(yaml.safe_dump(raw, sort_keys=False))
    return config


@pytest.fixture
def start_daemon(tmp_path, broker):
    started = []

    def start(config: Path, wait_online: Optional["Client"] = None, client_id: str = "edge-inferd") -> Daemon:
        d = Daemon(with_login(config, broker), broker.address, tmp_path / f"daemon-{len(started)}.log")
        started.append(d)
        if wait_online is not None:
            wait_online.subscribe(f"edge-inferd/{client_id}/status")
            wait_online.wait_payload(f"edge-inferd/{client_id}/status", b"online")
        return d

    yield start
    for d in started:
        d.stop()


@pytest.fixture
def home_assistant(tmp_path, broker):
    """A real Home Assistant on `broker` (tests/homeassistant/ha.py); its tests skip without its venv."""
    from tests.homeassistant import ha

    instance = ha.HomeAssistant(tmp_path / "ha", broker.port)
    try:
        yield instance.start()
    finally:
        instance.stop()


@pytest.fixture(scope="module")
def _v2_pool(tmp_path_factory):
    pool = v2_servers.V2Pool(tmp_path_factory.mktemp)
    yield pool
    pool.close()


@pytest.fixture(params=v2_servers.KINDS)
def v2_server(request, _v2_pool) -> v2_servers.V2Server:
    """Each real v2 server in turn (tests/integration/v2_servers.py) serving appliance_large;
    skipped without its venv (scripts/setup_v2.sh). Module-scoped underneath: one process per kind
    for the module's tests, restarted on the same url for the next test when a test killed it."""
    return _v2_pool.get(request.param)


@pytest.fixture
def mlserver_v2(_v2_pool) -> v2_servers.V2Server:
    """MLServer 1.7.1 serving appliance_large (as v2_server)."""
    return _v2_pool.get(v2_servers.MLSERVER)


@pytest.fixture
def kserve_v2(_v2_pool) -> v2_servers.V2Server:
    """KServe 0.21.0 serving appliance_large (as v2_server)."""
    return _v2_pool.get(v2_servers.KSERVE)
