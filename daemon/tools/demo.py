"""`edge-inferd demo`: private broker + the real daemon + replay of bundled test data.

For every route whose model has a `test.npz` beside it, its held-out samples are sent
as a real client would (JSON, or raw bytes for raw routes), with an MQTT v5
CorrelationData so raw requests can be matched too, WINDOW requests outstanding: every one
for classify routes, ANOMALY_SAMPLES balanced ones for anomaly, a few for values. With the
fetched SSD and photos (demo_camera) a camera route is added and sent JPEGs. The first
replies of each route are printed (-v: all; every frame of a camera), then a summary per
route by its kind (demo_kinds: accuracy, ROC-AUC, values' lengths, objects found), with
answered/sent, the daemon's own latency and the client-side p50/p99 round trip.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

import numpy as np
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from daemon import topics
from daemon.tools.broker import Broker, end_process
from daemon.config.schema import DETECT, VALUES, Config, RouteConfig
from daemon.config.loader import load_config
from daemon.config.model_files import read_labels
from daemon.model.runtime import open_interface
from daemon.tools import demo_camera
from daemon.tools.demo_kinds import RouteRun, answer_line, sample_indices, summary_line
from daemon.transport.link_common import STATUS_OFFLINE, STATUS_ONLINE
from daemon.transport.mqtt import disable_nagle, stop_loop

_DEVICE = "demo-1"  # fills each '+' of a route's filter
_READY_TIMEOUT_S = 60.0
_ANSWER_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 20.0
# Requests a demo client keeps outstanding, as a well-behaved sensor gateway would.
# Flow control must not rest on the broker alone: mosquitto 2.0.11 overshoots a
# v5 client's ReceiveMaximum (eclipse-mosquitto#2301).
WINDOW = 16
# Replies printed per route unless -v.
FIRST_ANSWERS = 5


def request_topic(route: RouteConfig) -> str:
    fill = {"+": _DEVICE, "#": "sample"}
    return "/".join(fill.get(level, level) for level in route.subscribe.split("/"))


def reply_topic(route: RouteConfig) -> str:
    topic = request_topic(route)
    return topics.render(route.publish, topic, topics.match(route.subscribe, topic) or ())


def _payload(route: RouteConfig, index: int, x) -> bytes:
    if route.input.format == "image":  # a JPEG already
        return bytes(x)
    if route.input.format == "raw":
        return x.astype(np.dtype(route.input.dtype).newbyteorder("<")).tobytes()
    if route.input.format == "npy":
        buf = io.BytesIO()
        np.save(buf, x.astype(np.float32), allow_pickle=False)
        return buf.getvalue()
    return json.dumps({"id": index, "data": x.tolist()}).encode()


class Replayer:
    """One v5 client: waits for the daemon's `online`, sends samples, collects answers."""

    def __init__(self, broker: str, status_topic: str, runs: dict[str, RouteRun], reply_topics: set[str]):
        host, port = broker.rsplit(":", 1)
        self._runs = runs
        self._status_topic = status_topic
        self.status: Optional[bytes] = None
        self.changed = threading.Condition()
        self._client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"edge-inferd-demo-{os.getpid()}",
                                   protocol=paho.MQTTv5)
        self._client.on_message = self._on_message
        topics_ = sorted(reply_topics | {status_topic})
        self._client.on_connect = lambda c, *_: (disable_nagle(c.socket()), c.subscribe([(t, 1) for t in topics_]))
        self._client.connect(host, int(port))
        self._client.loop_start()

    def _on_message(self, client, userdata, msg) -> None:
        with self.changed:
            if msg.topic == self._status_topic:
                self.status = msg.payload
            else:
                self._record(msg)
            self.changed.notify_all()

    def _record(self, msg) -> None:
        corr = getattr(msg.properties, "CorrelationData", None)
        if not corr:
            return
        route_name, index = corr.decode().rsplit(":", 1)
        run = self._runs.get(route_name)
        if run is not None and int(index) in run.sent_at:
            run.answers[int(index)] = json.loads(msg.payload)
            run.rtt_ms[int(index)] = (time.monotonic() - run.sent_at[int(index)]) * 1000.0

    def wait_for(self, predicate, timeout_s: float) -> bool:
        with self.changed:
            return self.changed.wait_for(predicate, timeout_s)

    def send(self, run: RouteRun, index: int) -> None:
        props = Properties(PacketTypes.PUBLISH)
        props.CorrelationData = f"{run.route.name}:{index}".encode()
        run.sent_at[index] = time.monotonic()
        self._client.publish(request_topic(run.route), _payload(run.route, index, run.x[index]), qos=1,
                             properties=props)

    def close(self) -> None:
        self._client.disconnect()
        stop_loop(self._client)


def _route_runs(config: Config, limit: int, camera: Optional[Path]) -> dict[str, RouteRun]:
    """What the demo sends each route: its model's test.npz (as its kind wants), or for a detect
    route the photos in `camera` (no run without them)."""
    runs = {}
    for route in config.routes:
        mc = config.models[route.model]
        labels = read_labels(mc.labels)
        names = list(labels.names) if labels else []
        if route.kind == DETECT:
            if camera is not None:
                x, y, samples = demo_camera.frames(camera, limit)
                runs[route.name] = RouteRun(route, x, np.array(y), names, samples=samples)
            continue
        data = mc.path.parent / "test.npz"
        if not data.exists():
            continue
        with np.load(data, allow_pickle=False) as npz:
            keep = sample_indices(route.kind, npz["y"], limit)
            run = RouteRun(route, npz["x"][keep], npz["y"][keep], names)
        if route.kind == VALUES:
            run.value_sizes = {s.name: s.sample_size for s in open_interface(mc.path, config.runtime).outputs}
        runs[route.name] = run
    return runs


def answer_lines(run: RouteRun, verbose: bool = False) -> list[str]:
    """The first FIRST_ANSWERS replies of a route (every one when verbose, and every frame of a
    camera), then how many were left out."""
    indices = sorted(run.answers)
    shown = indices if verbose or run.route.kind == DETECT else indices[:FIRST_ANSWERS]
    lines = [answer_line(run, i) for i in shown]
    if len(indices) > len(shown):
        lines.append(f"{run.route.name:<13} ... {len(indices) - len(shown)} more (-v prints every reply)")
    return lines


def summary_lines(runs: dict[str, RouteRun], skipped: Optional[str] = None) -> list[str]:
    """A header, then each route's line by its kind; `skipped`: why no camera was shown."""
    lines = [f"summary: round trip = client send to reply with {WINDOW} requests outstanding (queueing included); "
             "daemon = the replies' own latency_ms"]
    lines += [summary_line(run) for run in runs.values()]
    if skipped:
        lines.append(f"  {DETECT:<13} {skipped}")
    return lines


def summarize(runs: dict[str, RouteRun], skipped: Optional[str] = None) -> bool:
    print("\n" + "\n".join(summary_lines(runs, skipped)))
    return all(len(r.answers) == len(r.sent_at) and not any("error" in a for a in r.answers.values())
               for r in runs.values())


def run_demo(config_path: Path, limit: int = 0, quiet: bool = False, verbose: bool = False) -> bool:
    camera = demo_camera.models_dir()
    skipped = demo_camera.skip_reason(camera)
    with tempfile.TemporaryDirectory(prefix="edge-inferd-demo-") as tmp:
        served = config_path if skipped else demo_camera.with_camera(config_path, camera, Path(tmp))
        config = load_config(served)
        runs = _route_runs(config, limit, None if skipped else camera)
        return _serve(served, config, runs, Path(tmp), None if quiet else verbose, skipped)


def _serve(config_path: Path, config: Config, runs: dict[str, RouteRun], tmp: Path, verbose: Optional[bool],
           skipped: Optional[str]) -> bool:
    """The broker and the daemon on `config_path`, the replay (replies printed unless `verbose` is
    None; `skipped`: why the camera is not shown), then the stop."""
    with Broker() as broker:
        print(f"broker: mosquitto on {broker.address}")
        cmd = [sys.executable, "-m", "daemon", "run", "--config", str(config_path), "--broker", broker.address]
        log = open(tmp / "daemon.log", "wb")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        daemon = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        replies = {reply_topic(r.route) for r in runs.values()}
        client = Replayer(broker.address, config.mqtt.status_topic, runs, replies)
        try:
            replayed = replay(client, daemon, runs, verbose, skipped)
            return _stop(client, daemon) and replayed
        finally:
            client.close()
            if daemon.poll() is None:
                daemon.kill()
            log.close()
            print(f"daemon log: {(tmp / 'daemon.log').read_text()[-2000:]}" if daemon.returncode else "", end="")


def replay(client: Replayer, daemon: subprocess.Popen, runs: dict[str, RouteRun], verbose: Optional[bool],
           skipped: Optional[str] = None) -> bool:
    """Send every sample, WINDOW at a time; print the replies (none when `verbose` is None) and the summary
    (`skipped`: why no camera was shown)."""
    if not client.wait_for(lambda: client.status == STATUS_ONLINE or daemon.poll() is not None, _READY_TIMEOUT_S):
        print("daemon did not come online")
        return False
    if daemon.poll() is not None:  # died before it came online (its log is printed after the stop)
        print(f"daemon: exited with code {daemon.returncode} before it came online")
        return False
    print(f"daemon: online (pid {daemon.pid}); replaying {sum(len(r.x) for r in runs.values())} samples")
    outstanding = lambda: sum(len(r.sent_at) - len(r.answers) for r in runs.values())  # noqa: E731
    for run in runs.values():
        for i in range(len(run.x)):
            if not client.wait_for(lambda: outstanding() < WINDOW, _ANSWER_TIMEOUT_S):
                break
            client.send(run, i)
    done = lambda: all(len(r.answers) == len(r.sent_at) for r in runs.values())  # noqa: E731
    client.wait_for(done, _ANSWER_TIMEOUT_S)
    if verbose is not None:
        for run in runs.values():
            print("\n".join(answer_lines(run, verbose)))
    return summarize(runs, skipped)


def _stop(client: Replayer, daemon: subprocess.Popen) -> bool:
    code = end_process(daemon, signal.SIGTERM, _STOP_TIMEOUT_S)  # killed if it hangs, never a traceback
    client.wait_for(lambda: client.status == STATUS_OFFLINE, _STOP_TIMEOUT_S)
    print(f"daemon: stopped with exit code {code}; status {client.status.decode() if client.status else '?'}")
    return code == 0 and client.status == STATUS_OFFLINE
