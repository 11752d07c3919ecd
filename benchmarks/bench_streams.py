"""Sensor streams side by side: the daemon's stream route, the naive buffering script and the paho
echo, on 200 devices at 50 Hz, one sample a message.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_streams.py [--devices 200] [--hz 50] [--seconds 10]
        [--rounds 3] [--out results.json]

One private mosquitto; one C publisher (`mosquitto_pub -l`) paced at devices x hz messages a
second, each message `{"id", "seq", "device", "data": [6 values]}` on one topic (the device named by
a field: `input.stream.key: device`), the devices' signals the activity model's test split laid
end to end; a `mosquitto_sub` collecting the replies. Each consumer runs alone, the order turning
each round:
- `daemon`: config.yaml as written, its routes replaced by one stream route on the activity model
  (its window, 100 samples, a window every 50), and a clean session each run;
- `naive`: `python -m daemon.tools.baselines naive-stream` (paho's defaults, a dict of deques,
  the window inferred inline);
- `echo`: the paho echo (paho's defaults): a 16-byte reply to every message, no decoding.
Reported per consumer: its process CPU per message (utime + stime over the run, /proc), results,
and the daemon's and naive's CPU per message over the echo's, per round. The daemon's answers
are checked against the naive script's, window by window (label, and score to 6 decimals).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from daemon.tools.bench.load import (Collector, ConsumerProcess, LinePublisher, end_session,  # noqa: E402
                                     require_clients)
from daemon.tools.broker import Broker  # noqa: E402

TOPIC, REPLIES, ROUTE = "sensors/all/imu/stream", "results/all/activity-stream", "activity-stream"
WINDOW, HOP = 100, 50
CHUNK_S = 0.01  # the publisher writes a hundredth of a second's messages at a time
SETTLE_S = 5.0  # no new reply for this long after the last publish: the consumer is done
WARM_TIMEOUT_S = 30.0


def write_config(tmp: Path) -> Path:
    raw = yaml.safe_load((ROOT / "config.yaml").read_text())
    whole = next(r for r in raw["routes"] if r["name"] == "activity")
    route = {**whole, "name": ROUTE, "subscribe": TOPIC, "publish": REPLIES,
             "input": {**whole["input"], "stream": {"key": "device", "seq": "seq", "hop": HOP}}}
    route.pop("validate", None)
    for model in raw["models"].values():
        for key in ("path", "labels"):
            if model.get(key):
                model[key] = str(ROOT / model[key])
    raw["routes"] = [route]
    raw["models"] = {"activity": raw["models"]["activity"]}
    raw["mqtt"] = {**raw["mqtt"], "client_id": "bench-daemon", "session_expiry_s": 0,
                   "outbox": {"dir": str(tmp / "outbox")}}
    raw["cache"] = {**(raw.get("cache") or {}), "dir": str(tmp / "cache")}
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def messages(devices: int, per_device: int) -> list[bytes]:
    """The devices' samples interleaved in time, one line each; ids are device * 1e6 + seq."""
    with np.load(ROOT / "models/activity/test.npz") as data:
        x = np.round(data["x"], 3)
    windows = -(-per_device // len(x[0])) + 1
    signals = [np.concatenate([x[(d * 7 + i) % len(x)] for i in range(windows)])[:per_device] for d in range(devices)]
    return [json.dumps({"id": d * 1_000_000 + s, "seq": s, "device": f"d{d}", "data": signals[d][s].tolist()},
                       separators=(",", ":")).encode() + b"\n"
            for s in range(per_device) for d in range(devices)]


def warm_lines() -> bytes:
    """A window of a device of its own, with negative ids: a reply to any of them (a window's, or
    the echo's) says that the publisher is connected and the consumer subscribed and serving."""
    with np.load(ROOT / "models/activity/test.npz") as data:
        rows = np.round(data["x"][0], 3)
    return b"".join(json.dumps({"id": -(s + 1), "seq": s, "device": "warm", "data": rows[s].tolist()}).encode() + b"\n"
                    for s in range(WINDOW))


def publish_paced(pub: LinePublisher, lines: list[bytes], rate: float) -> float:
    per_chunk = max(1, int(rate * CHUNK_S))
    started = time.monotonic()
    for i in range(0, len(lines), per_chunk):
        pause = started + i / rate - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        pub.stdin.write(b"".join(lines[i:i + per_chunk]))
        pub.stdin.flush()
    return time.monotonic() - started  # open until the replies settle: at EOF mosquitto_pub may drop its last lines


class AnswerCollector(Collector):
    """Every reply by id, with its label and score (the daemon's answers are checked against the naive's)."""

    def __init__(self, *args):
        self.answers: dict[int, tuple] = {}
        super().__init__(*args)

    def _arrived(self, at: float, obj) -> None:
        super()._arrived(at, obj)
        if isinstance(obj, dict) and "label" in obj:
            self.answers[obj["id"]] = (obj["label"], round(obj["score"], 6))


def consumer_command(kind: str, address: str, config: Path) -> tuple[list[str], str]:
    if kind == "daemon":
        return [sys.executable, "-m", "daemon", "run", "--config", str(config), "--broker", address], "bench-daemon"
    return [sys.executable, "-m", "daemon.tools.baselines", "naive-stream" if kind == "naive" else "echo",
            "--broker", address, "--config", str(config), "--route", ROUTE, "--client-id", kind], kind


def run_one(kind: str, address: str, config: Path, lines: list[bytes], rate: float, expected: int,
            tmp: Path) -> tuple[dict, dict]:
    """One consumer alone: its figures, and its answers by id."""
    ids = [json.loads(line)["id"] for line in lines]
    expected_ids = set(ids) if kind == "echo" else {i for i in ids if i % 1_000_000 >= WINDOW - 1
                                                    and (i % 1_000_000 - WINDOW + 1) % HOP == 0}
    cmd, client_id = consumer_command(kind, address, config)
    status = f"edge-inferd/{client_id}/status"
    collector = AnswerCollector(address, REPLIES)
    consumer = ConsumerProcess(cmd, address, status, tmp / f"{kind}.log",
                               env={"PYTHONPATH": str(ROOT)})
    pub = LinePublisher(address, TOPIC)
    try:
        pub.send(warm_lines())
        if not collector.wait(lambda: collector.probes > 0, WARM_TIMEOUT_S):
            raise SystemExit(f"{kind}: the warm-up window was not answered within {WARM_TIMEOUT_S:g} s")
        before = consumer.cpu_s()
        wall = publish_paced(pub, lines, rate)
        collector.settle(lambda: len(collector.by_id) >= expected, SETTLE_S)
        cpu = consumer.cpu_s() - before
    finally:
        pub.close()
        consumer.stop()
        collector.close()
        if kind == "daemon":
            end_session(address, client_id)
    figures = {"cpu_s": round(cpu, 3), "cpu_us_per_message": round(cpu / len(lines) * 1e6, 2),
               "publish_s": round(wall, 2), "replies": len(collector.by_id), "expected": expected,
               "missing": sorted(i for i in expected_ids - set(collector.by_id))[:12]}
    return figures, dict(collector.answers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=200)
    parser.add_argument("--hz", type=float, default=50.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    require_clients()
    per_device = int(args.hz * args.seconds)
    lines = messages(args.devices, per_device)
    windows = args.devices * ((per_device - WINDOW) // HOP + 1)
    expected = {"daemon": windows, "naive": windows, "echo": len(lines)}
    order, rounds = ["daemon", "naive", "echo"], []
    with tempfile.TemporaryDirectory(prefix="bench-streams-") as tmp, Broker() as broker:
        config = write_config(Path(tmp))
        for n in range(args.rounds):
            figures, answers = {}, {}
            for kind in order:
                print(f"round {n + 1}: {kind}", file=sys.stderr, flush=True)
                figures[kind], answers[kind] = run_one(kind, broker.address, config, lines,
                                                       args.devices * args.hz, expected[kind], Path(tmp))
            echo = figures["echo"]["cpu_us_per_message"]
            figures["ratio_to_echo"] = {k: round(figures[k]["cpu_us_per_message"] / echo, 3) for k in ("daemon", "naive")}
            same = sum(answers["daemon"].get(i) == a for i, a in answers["naive"].items())
            figures["daemon_equals_naive"] = f"{same} of {len(answers['naive'])} windows"
            rounds.append(figures)
            order = order[1:] + order[:1]
    report = {"devices": args.devices, "hz": args.hz, "messages": len(lines), "windows": windows, "rounds": rounds}
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
