#!/usr/bin/env python3
"""The garbage collector's share of the daemon's CPU on a burst, by GC setting, end to end.

    .venv/bin/python tools/dev/profile_gc.py [--route activity] [--n 5000] [--modes default freeze gen0=10000]

For each mode in turn (alternating over `--rounds`), a private mosquitto and `edge-inferd run`
(the default config, cache off, so every request runs the model) serve a warm-up, then a
burst of `--n` distinct requests pushed by `mosquitto_pub -l`. A wrapper around the daemon
sets the mode and times every collection (`gc.callbacks`); the figures are over the burst
only: daemon CPU per answer, GC CPU time per answer (thread CPU time around each collection,
so other processes on a loaded machine do not inflate it) and collections per 1,000 answers
by generation, and answers per second over the burst (its drain rate). Modes, joined by `+`: `default` (CPython's 700/10/10, the daemon's own freeze
turned off), `freeze` (`gc.freeze()` once the workers have started, as
daemon/lifecycle/service.py does), `gen0=N` (gen-0 threshold N from the start).
"""

from __future__ import annotations

import argparse
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

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from daemon.config.reader import absolute_paths  # noqa: E402
from daemon.tools.broker import Broker, end_process  # noqa: E402

TOPICS = {"activity": ("sensors/gc/imu", "results/gc/activity"), "appliance": ("plugs/gc/power", "results/gc/appliance")}
WARM_UP = 300
WAIT_S = 120.0
_POLL_S = 0.05

# Runs the daemon with the mode set and every collection timed; dumps the totals on request.
_WRAPPER = r"""
import gc, json, os, sys, threading, time
mode, out, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
totals = {"n": [0, 0, 0], "s": 0.0}
began = [0.0]
def timed(phase, info):
    if phase == "start":
        began[0] = time.thread_time()  # CPU time: a collection runs on the thread that set it off
    else:
        totals["s"] += time.thread_time() - began[0]
        totals["n"][info["generation"]] += 1
gc.callbacks.append(timed)
parts = mode.split("+")
for part in parts:
    if part.startswith("gen0="):
        gc.set_threshold(int(part[5:]), 10, 10)
import daemon.lifecycle.service as service
if "freeze" not in parts:  # the daemon's own settling off: measure without it
    gc.freeze = lambda: None
    service.settle_gc = lambda: None
elif not hasattr(service, "settle_gc"):  # a tree whose daemon does not freeze: freeze where it would
    started = service.Service._start_workers
    def start_then_freeze(self):
        started(self)
        gc.collect()
        gc.freeze()
    service.Service._start_workers = start_then_freeze
def dump():
    while True:
        if os.path.exists(out + ".ask"):
            os.remove(out + ".ask")
            t = os.times()
            with open(out + ".tmp", "w") as fh:
                json.dump({**totals, "cpu_s": t.user + t.system}, fh)
            os.replace(out + ".tmp", out)
        time.sleep(0.01)
threading.Thread(target=dump, daemon=True).start()
from daemon.cli import main
sys.exit(main(argv))
"""


class Replies:
    def __init__(self, broker: Broker, topic: str):
        self.count = 0
        self.cond = threading.Condition()
        self.c = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
        self.c.on_message = self._on_message
        self.c.connect("127.0.0.1", broker.port)
        self.c.loop_start()
        done = threading.Event()
        self.c.on_subscribe = lambda *a: done.set()
        self.c.subscribe([(topic, 1), ("edge-inferd/gc/status", 1)])
        assert done.wait(WAIT_S)
        self.online = threading.Event()
        self.topic = topic

    def _on_message(self, client, userdata, msg) -> None:
        if msg.topic.endswith("/status"):
            if msg.payload == b"online":
                self.online.set()
            return
        with self.cond:
            self.count += 1
            self.cond.notify_all()

    def wait(self, n: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: self.count >= n, WAIT_S), f"{self.count} of {n} replies"


def _payload_file(tmp: Path, route: str, n: int, first: int) -> Path:
    with np.load(ROOT / f"models/{route}/test.npz") as data:
        xs = data["x"]
    rng = np.random.default_rng(first)
    path = tmp / f"burst-{first}.txt"
    with open(path, "w") as fh:
        for i in range(first, first + n):  # distinct: a sensor stream never repeats exactly
            x = np.round(xs[i % len(xs)] + rng.normal(0, 0.01, xs.shape[1:]), 3)
            fh.write(json.dumps({"id": i, "data": x.tolist()}, separators=(",", ":")) + "\n")
    return path


def _config(tmp: Path, workers: int, least: int) -> Path:
    raw = absolute_paths(yaml.safe_load((ROOT / "config.yaml").read_text()), ROOT)
    raw["cache"] = {**raw["cache"], "enabled": False}
    raw["mqtt"] = {**raw["mqtt"], "client_id": "gc", "session_expiry_s": 0}
    raw["mqtt"]["outbox"] = {"max_mb": 0}
    raw["workers"] = {**raw["workers"], "max": workers, "min": min(least, workers)}
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _ask(out: Path) -> dict:
    out.unlink(missing_ok=True)
    Path(str(out) + ".ask").touch()
    for _ in range(int(WAIT_S / _POLL_S)):
        if out.exists():
            return json.loads(out.read_text())
        time.sleep(_POLL_S)  # polling the wrapper's dump file; the limit only bounds a failure
    raise TimeoutError("the daemon wrapper did not answer")


def _publish(broker: Broker, topic: str, path: Path) -> None:
    with open(path, "rb") as fh:
        subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(broker.port), "-q", "1", "-l", "-t", topic],
                       stdin=fh, check=True, timeout=WAIT_S)


def _one(mode: str, args, tmp: Path) -> dict:
    request_topic, reply_topic = TOPICS[args.route]
    with Broker(tmp / f"broker-{mode}") as broker:
        replies = Replies(broker, reply_topic)
        out = tmp / f"gc-{mode}.json"
        log = open(tmp / f"daemon-{mode}.log", "wb")
        proc = subprocess.Popen([sys.executable, "-c", _WRAPPER, mode, str(out), "run", "--config",
                                 str(_config(tmp, args.workers, args.min)), "--broker", broker.address],
                                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            assert replies.online.wait(WAIT_S), (tmp / f"daemon-{mode}.log").read_text()[-2000:]
            _publish(broker, request_topic, _payload_file(tmp, args.route, WARM_UP, 0))
            replies.wait(WARM_UP)
            burst = _payload_file(tmp, args.route, args.n, WARM_UP)
            before = _ask(out)
            began = time.perf_counter()
            _publish(broker, request_topic, burst)
            replies.wait(WARM_UP + args.n)
            wall = time.perf_counter() - began
            after = _ask(out)
        finally:
            end_process(proc)
            log.close()
            replies.c.loop_stop()
    n = args.n
    return {"mode": mode, "workers": f"{min(args.min, args.workers)}-{args.workers}", "answers_per_s": round(n / wall), "cpu_us": round((after["cpu_s"] - before["cpu_s"]) / n * 1e6, 1),
            "gc_us": round((after["s"] - before["s"]) / n * 1e6, 2),
            "collections_per_1k": [round((a - b) / n * 1000, 1) for a, b in zip(after["n"], before["n"])]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--route", default="activity", choices=sorted(TOPICS))
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=2, help="workers.max (config.yaml: 2)")
    parser.add_argument("--min", type=int, default=1, help="workers.min (default 1: adaptive up to --workers)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--modes", nargs="+", default=["default", "freeze", "gen0=10000"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="edge-inferd-gc-") as tmp:
        os.chmod(tmp, 0o711)  # a root-started mosquitto must reach its directory (PITFALLS)
        for _ in range(args.rounds):
            for mode in args.modes:
                print(json.dumps({"route": args.route, **_one(mode, args, Path(tmp))}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
