"""`edge-inferd demo --fleet` (`./scripts/demo.sh --fleet`): fleet delivery end to end, in one command.

Three daemons (gw1, gw2, gw3) on one private mosquitto, each serving the bundled activity model
as a managed model on a topic of its own. A signing key and a release server (http.server on a
free port) in a temporary directory, with two signed releases of the model:
- 1.1.0: another build of it (a float32 interface, the same answers), rolled out in waves
  1, 2, 100% while each node gets live traffic for its canary, long enough for the canary to
  judge both the CPU time per sample and the PSI of the answers (the status table shows them);
- 1.2.0: the same model with its labels permuted, as a packaging mistake would ship it. The
  first wave's node measures it on its own validate data through the release's labels, its
  gate refuses it, and the rollout aborts before any other node hears of it.
The status table is printed after each rollout; everything stops at the end.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import paho.mqtt.client as paho
import yaml
from paho.mqtt.enums import CallbackAPIVersion

from daemon.config.reader import absolute_paths
from daemon.fleet.controller import controller
from daemon.fleet.release import minisign
from daemon.fleet.controller.publish import make_release
from daemon.tools.broker import Broker, end_process
from daemon.tools.release_server import ReleaseServer
from daemon.transport.mqtt import stop_loop

ROOT = Path(__file__).resolve().parents[2]
ACTIVITY = ROOT / "models/activity"
SECOND_BUILD = ROOT / "tests/fixtures/activity_float_io"  # ships in the sdist's tests; the demo runs from a checkout
NODES = ("gw1", "gw2", "gw3")
# Each node's live traffic while a rollout runs, one request at a time (an invoke each).
TRAFFIC_PER_S = 100.0
# A canary that reaches both checks' minimums (daemon/fleet/node/canary.py): 200 answers of each
# release for the PSI, 100 invokes compared for the CPU time per sample. The previous release's
# come from before the swap: the rollout starts once every node has answered WARM_ANSWERS.
DEMO_CANARY = {"duration_s": 2, "min_answers": 200}
WARM_ANSWERS = 200
_READY_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 20.0


def node_config(directory: Path, client_id: str, trusted_key: str, validate: bool = True, **fleet) -> Path:
    """A node serving only config.yaml's activity route, on `sensors/<client_id>/+/imu`, the
    model managed by the fleet (its store in `directory`), trusting `trusted_key`."""
    raw = absolute_paths(yaml.safe_load((ROOT / "config.yaml").read_text()), ROOT)
    route = next(r for r in raw["routes"] if r["name"] == "activity")
    route["subscribe"] = f"sensors/{client_id}/+/imu"
    route["publish"] = f"results/{client_id}/{{1}}/activity"
    if validate:
        route["validate"] = {"data": str(ACTIVITY / "test.npz")}
    else:
        route.pop("validate", None)
    raw["routes"] = [route]
    raw["models"] = {"activity": {**raw["models"]["activity"], "managed": True}}
    raw["mqtt"] = {**raw["mqtt"], "client_id": client_id}
    raw["cache"] = {"enabled": False}
    raw["stats_interval_s"] = 1
    raw["fleet"] = {"enabled": True, "trusted_keys": [trusted_key], "store_dir": str(directory / "store"), **fleet}
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


class Traffic:
    """Each node's sensor, in a thread: the activity test windows, round robin, at TRAFFIC_PER_S;
    the answers counted per node."""

    def __init__(self, broker: Broker, nodes: tuple[str, ...]):
        with np.load(ACTIVITY / "test.npz") as data:
            self._windows = [np.round(x, 3).tolist() for x in data["x"]]
        self._answered = {node: 0 for node in nodes}
        self._cond = threading.Condition()
        self._client = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
        self._client.on_message = self._on_answer
        self._client.on_connect = lambda c, *a: c.subscribe("results/+/wrist/activity", qos=1)
        self._client.connect("127.0.0.1", broker.port)
        self._client.loop_start()
        self._nodes = nodes
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="traffic", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        n = 0
        while not self._stop.wait(1.0 / TRAFFIC_PER_S):
            for node in self._nodes:
                payload = json.dumps({"id": n, "data": self._windows[n % len(self._windows)]})
                self._client.publish(f"sensors/{node}/wrist/imu", payload, qos=1)
            n += 1

    def _on_answer(self, client, userdata, msg) -> None:
        with self._cond:
            self._answered[msg.topic.split("/")[1]] += 1
            self._cond.notify_all()

    def wait_answered(self, n: int) -> None:
        """Until every node has answered `n` requests (the running release's window for the canary)."""
        with self._cond:
            if not self._cond.wait_for(lambda: min(self._answered.values()) >= n, _READY_TIMEOUT_S):
                raise RuntimeError(f"answers {self._answered}: not {n} each within {_READY_TIMEOUT_S:g} s")

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._client.disconnect()
        stop_loop(self._client)


def run_fleet_demo() -> bool:
    with tempfile.TemporaryDirectory(prefix="edge-inferd-fleet-demo-") as tmp_name:
        tmp = Path(tmp_name)
        key = minisign.generate()
        with Broker() as broker, ReleaseServer(tmp / "site") as site:
            print(f"broker: mosquitto on {broker.address}; releases: {site.url('')}")
            good, bad = _releases(site, key)
            daemons = [_start(tmp, broker, node, key) for node in NODES]
            try:
                _wait_online(broker, NODES)
                return _rollouts(broker, good, bad)
            finally:
                for node, daemon in zip(NODES, daemons):
                    code = end_process(daemon, timeout_s=_STOP_TIMEOUT_S)
                    if code != 0:
                        print(f"{node} exited {code}; its log: {tmp / node / 'daemon.log'}")


def _releases(site: ReleaseServer, key: minisign.SecretKey) -> tuple[str, str]:
    make_release(site.root / "activity/2", "activity", "1.1.0", 2, SECOND_BUILD / "model.tflite",
                 SECOND_BUILD / "labels.txt", key, summary="another build of the activity model (float32 interface)")
    labels = [line for line in (ACTIVITY / "labels.txt").read_text().splitlines() if line.strip()]
    permuted = site.root.parent / "permuted" / "labels.txt"
    permuted.parent.mkdir()
    permuted.write_text("\n".join(labels[1:] + labels[:1]) + "\n")
    make_release(site.root / "activity/3", "activity", "1.2.0", 3, ACTIVITY / "model.tflite", permuted, key,
                 summary="the same model, its labels permuted (a packaging mistake)")
    print("releases: activity 1.1.0 (serial 2) and 1.2.0 (serial 3, labels permuted), signed by key "
          f"{key.key_id_hex}")
    return site.url("activity/2/"), site.url("activity/3/")


def _start(tmp: Path, broker: Broker, node: str, key: minisign.SecretKey) -> subprocess.Popen:
    config = node_config(tmp / node, node, key.public_key.line, canary=DEMO_CANARY)
    log = open(tmp / node / "daemon.log", "wb")
    return subprocess.Popen([sys.executable, "-m", "daemon", "run", "--config", str(config), "--broker",
                             broker.address], stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _wait_online(broker: Broker, nodes: tuple[str, ...]) -> None:
    """Until every node's fleet agent has reported (its retained document is there)."""
    seen: set[str] = set()
    done = threading.Event()
    client = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)

    def on_message(c, userdata, msg) -> None:
        seen.add(msg.topic.split("/")[1])
        if seen >= set(nodes):
            done.set()

    client.on_message = on_message
    client.on_connect = lambda c, *a: c.subscribe("edge-inferd/+/fleet/reported", qos=1)
    client.connect("127.0.0.1", broker.port)
    client.loop_start()
    try:
        if not done.wait(_READY_TIMEOUT_S):
            raise RuntimeError(f"nodes {sorted(set(nodes) - seen)} did not report within {_READY_TIMEOUT_S:g} s")
    finally:
        client.disconnect()
        stop_loop(client)
    print(f"nodes: {', '.join(nodes)} serving the bundled activity model, each on its own topic")


def _rollouts(broker: Broker, good: str, bad: str) -> bool:
    traffic = Traffic(broker, NODES)
    try:
        traffic.wait_answered(WARM_ANSWERS)
        print("\n$ edge-inferd fleet rollout --model activity --release .../activity/2/ --serial 2 --waves 1,2,100%")
        started = time.monotonic()
        first = controller.rollout(controller.RolloutOptions(broker.address, "activity", good, 2, waves="1,2,100%",
                                                             version="1.1.0", wave_timeout_s=120), sys.stdout)
        print(f"(exit {first}, {time.monotonic() - started:.1f} s)")
        _table(broker)
        print("\n$ edge-inferd fleet rollout --model activity --release .../activity/3/ --serial 3 --waves 1,2,100%")
        second = controller.rollout(controller.RolloutOptions(broker.address, "activity", bad, 3, waves="1,2,100%",
                                                              version="1.2.0", wave_timeout_s=120), sys.stdout)
        print(f"(exit {second}: the gate stopped it on the first wave)")
        table = _table(broker)
    finally:
        traffic.close()
    return first == controller.EXIT_OK and second == controller.EXIT_NOT_DONE and "gate" in table


def _table(broker: Broker) -> str:
    out = io.StringIO()
    controller.status(controller.StatusOptions(broker.address, model="activity"), out)
    print("\n$ edge-inferd fleet status --model activity\n" + out.getvalue().rstrip())
    return out.getvalue()
