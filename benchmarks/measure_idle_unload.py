#!/usr/bin/env python3
"""Scale to zero, measured: RSS of a real daemon before and after an idle unload, per model.

    .venv/bin/python benchmarks/measure_idle_unload.py [--idle-s 2] [--workers 2]

For each bundled model: a private mosquitto and `edge-inferd run` on a copy of config.yaml
that keeps only that model and its routes (cache off, `workers.idle_unload_s` = --idle-s,
stats every 0.1 s). VmRSS (/proc/<pid>/status) is read once the retained stats show the
model loaded, again once they show it unloaded, and after one request has loaded it again
(on one worker). The arena to compare with is measured in a fresh process: RSS before and
after loading --workers warmed copies (what the daemon's workers hold), and whether the RSS
falls when they are freed with and without glibc's malloc_trim(0). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np
import paho.mqtt.client as paho
import yaml
from paho.mqtt.enums import CallbackAPIVersion

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from daemon.tools.broker import Broker, end_process  # noqa: E402
from daemon.config.reader import absolute_paths  # noqa: E402

WAIT_S = 60.0
STATS = "edge-inferd/edge-inferd/stats"

# Run in a fresh interpreter: RSS with and without `workers` warmed copies of one model.
_ARENA = """
import ctypes, gc, json, sys
from daemon.config.loader import load_config
from daemon.config.model_files import open_model
def rss():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS:"))
config = load_config(sys.argv[1], check_models=False)
warm = open_model(config, sys.argv[2]); warm.warm_up(); del warm; gc.collect()  # libraries mapped in
ctypes.CDLL("libc.so.6").malloc_trim(0)
base = rss()
copies = [open_model(config, sys.argv[2]) for _ in range(int(sys.argv[3]))]
for c in copies:
    c.warm_up()
loaded = rss()
del copies, c; gc.collect()
freed = rss()
ctypes.CDLL("libc.so.6").malloc_trim(0)
print(json.dumps({"base_kib": base, "loaded_kib": loaded, "freed_no_trim_kib": freed, "freed_trim_kib": rss()}))
"""


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))


class Watcher:
    """Every JSON message on the stats and reply topics, with a wait for one that matches."""

    def __init__(self, port: int):
        self.messages: list[tuple[str, dict]] = []
        self.cond = threading.Condition()
        self.c = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
        self.c.on_message = self._on_message
        self.c.connect("127.0.0.1", port)
        self.c.loop_start()

    def _on_message(self, client, userdata, msg) -> None:
        with self.cond:
            self.messages.append((msg.topic, json.loads(msg.payload)))
            self.cond.notify_all()

    def wait(self, topic: str, wanted) -> dict:
        def found() -> list:
            return [p for t, p in self.messages if t == topic and wanted(p)]
        with self.cond:
            if not self.cond.wait_for(found, WAIT_S):
                raise SystemExit(f"timed out waiting on {topic}")
            return found()[-1]


def one_model_config(tmp: Path, model: str, idle_s: float, workers: int) -> Path:
    raw = absolute_paths(yaml.safe_load((ROOT / "config.yaml").read_text()), ROOT)
    raw["models"] = {model: raw["models"][model]}
    raw["routes"] = [r for r in raw["routes"] if r["model"] == model]
    raw["cache"] = {"enabled": False, "dir": str(tmp / "cache")}
    raw["mqtt"] = {**raw["mqtt"], "client_id": "edge-inferd"}
    raw["workers"] = {**raw["workers"], "max": workers, "idle_unload_s": idle_s}
    raw["stats_interval_s"] = 0.1
    path = tmp / f"{model}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def request(model: str, route: dict) -> tuple[str, bytes]:
    with np.load(ROOT / "models" / model / "test.npz") as data:
        sample = data["x"][0]
    topic = route["subscribe"].replace("+", "m1")
    return topic, json.dumps({"id": 1, "data": sample.tolist()}).encode()


def measure_daemon(model: str, idle_s: float, workers: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp, Broker(Path(tmp) / "broker") as broker:
        config = one_model_config(Path(tmp), model, idle_s, workers)
        route = yaml.safe_load(config.read_text())["routes"][0]
        watcher = Watcher(broker.port)
        watcher.c.subscribe([(STATS, 1), (route["publish"].replace("{1}", "m1"), 1)])
        proc = subprocess.Popen([sys.executable, "-m", "daemon", "run", "--config", str(config), "--broker",
                                 broker.address], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            watcher.wait(STATS, lambda s: s["models"][model]["loaded"] and s["uptime_s"] >= idle_s / 2)  # settled
            loaded = rss_kib(proc.pid)
            watcher.wait(STATS, lambda s: not s["models"][model]["loaded"])
            unloaded = rss_kib(proc.pid)
            watcher.c.publish(*request(model, route), qos=1)
            stats = watcher.wait(STATS, lambda s: s["models"][model]["cold_starts"] >= 1)
            reloaded = rss_kib(proc.pid)
        finally:
            end_process(proc)
            watcher.c.loop_stop()
    return {"rss_loaded_kib": loaded, "rss_unloaded_kib": unloaded, "rss_fall_kib": loaded - unloaded,
            "rss_after_one_request_kib": reloaded, "cold_start_ms": stats["models"][model]["cold_start_ms"]}


def measure_arena(model: str, workers: int) -> dict:
    out = subprocess.run([sys.executable, "-c", _ARENA, str(ROOT / "config.yaml"), model, str(workers)],
                         cwd=ROOT, check=True, capture_output=True, text=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    return {"arena_kib": r["loaded_kib"] - r["base_kib"], "freed_without_trim_kib": r["loaded_kib"] -
            r["freed_no_trim_kib"], "freed_with_trim_kib": r["loaded_kib"] - r["freed_trim_kib"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle-s", type=float, default=2.0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    report = {}
    for model in ("activity", "appliance"):
        report[model] = {**measure_arena(model, args.workers), **measure_daemon(model, args.idle_s, args.workers)}
        report[model]["fall_share_of_arena"] = round(report[model]["rss_fall_kib"] / report[model]["arena_kib"], 3)
    print(json.dumps({"idle_unload_s": args.idle_s, "workers": args.workers, "models": report}, indent=2))


if __name__ == "__main__":
    main()
