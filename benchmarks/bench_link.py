"""The transport's own CPU per request: an echo through an MqttLink against the bare paho echo.

    python benchmarks/bench_link.py [--link [ROOT@]daemon.transport.mqtt:MqttLink ...] [--requests 10000]
        [--rounds 3] [--floats 150] [--protocol 5|3.1.1] [--reply-from worker|loop] [--correlation DATA]
        [--no-echo]

A private mosquitto; each round runs every consumer in turn, one at a time, on the same requests:
- `echo`: `daemon.tools.baselines echo`, the bare paho floor (replies inside `on_message`).
- each `--link MODULE:CLASS` (the MqttLink interface: `daemon.transport.mqtt:MqttLink`, or another
  transport built against it; `ROOT@` runs the copy of this script in another checkout, e.g. a
  git worktree of an older commit, to compare two versions side by side; `#3.1.1` or `#5` after it
  sets that link's protocol, to compare protocols side by side), in a child process whose intake hands each read burst to an "echo
  worker" thread that replies to every request inside `link.batch()`, as the daemon's workers do;
  each request is acked once its reply's PUBACK is back, as in the daemon (`--reply-from loop`
  replies on the network thread, inside the intake call, as the paho echo does).
Each consumer gets a warm-up, then a `mosquitto_pub -l` burst of `--requests` distinct JSON
requests (`{"id": i, "data": [[v], [v], ...]}`, `--floats` values), all at QoS 1; the bench waits
for every reply. It prints, per consumer and round, the process CPU per reply and, for a link,
the CPU of each of its threads (from /proc/<pid>/task) per reply, and the messages per intake
call (read burst); then the median of each over the rounds. Figures vary with the machine's load: compare consumers of the same run.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from daemon.config.mqtt import PROTOCOLS, MqttConfig, OutboxConfig  # noqa: E402
from daemon.tools.baselines import echo_reply  # noqa: E402
from daemon.tools.bench.load import Collector, ConsumerProcess, LinePublisher, process_cpu_s  # noqa: E402
from daemon.tools.broker import Broker  # noqa: E402

DEFAULT_LINK = "daemon.transport.mqtt:MqttLink"
# The topics of config.yaml's `activity` route, which the paho echo serves.
REQUEST_FILTER = "sensors/+/imu"
REQUEST_TOPIC = "sensors/bench/imu"
REPLY_TOPIC = "results/bench/activity"
RECEIVE_MAXIMUM = 1024  # what the daemon asks for (daemon/lifecycle/service.py, RECEIVE_MAXIMUM_CAP)
WARMUP = 500
TIMEOUT_S = 300.0
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _load_link(spec: str) -> type:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name or "MqttLink")


class Publisher(LinePublisher):
    """`mosquitto_pub -l` on the request topic; with `correlation`, every request carries that v5
    CorrelationData (so every reply carries it back)."""

    def __init__(self, address: str, correlation: Optional[str]):
        if correlation is None:
            super().__init__(address, REQUEST_TOPIC)
            return
        host, port = address.rsplit(":", 1)
        self._proc = subprocess.Popen(["mosquitto_pub", "-h", host, "-p", port, "-q", "1", "-t", REQUEST_TOPIC,
                                       "-l", "-V", "5", "-D", "publish", "correlation-data", correlation],
                                      stdin=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.stdin = self._proc.stdin


class EchoWorker:
    """Replies to every request of every burst handed to it, in order, inside `link.batch()`."""

    def __init__(self, from_loop: bool):
        self.link = None
        self.calls = 0
        self.messages = 0
        self._from_loop = from_loop
        self._bursts: queue.SimpleQueue = queue.SimpleQueue()

    def on_burst(self, inbounds: Sequence) -> None:
        self.calls += 1
        self.messages += len(inbounds)
        if self._from_loop:
            self._reply([inbounds])
        else:
            self._bursts.put(inbounds)

    def run(self) -> None:
        while True:
            bursts = [self._bursts.get()]
            while not self._bursts.empty():
                bursts.append(self._bursts.get_nowait())
            self._reply(bursts)

    def _reply(self, bursts: list) -> None:
        with self.link.batch():
            for burst in bursts:
                for inbound in burst:
                    self.link.reply(REPLY_TOPIC, echo_reply(inbound.payload), inbound)


def serve(args: argparse.Namespace) -> None:
    """The child: a link with an echo worker; writes its threads' ids, and on SIGUSR1 its counts."""
    config = MqttConfig(broker=args.broker, client_id=args.client_id, protocol=PROTOCOLS[args.protocol],
                        session_expiry_s=0, outbox=OutboxConfig(max_mb=0))
    echo = EchoWorker(args.reply_from == "loop")
    link = _load_link(args.link)(config, [REQUEST_FILTER], echo.on_burst, receive_maximum=RECEIVE_MAXIMUM)
    echo.link = link
    threading.Thread(target=echo.run, name="echo-worker", daemon=True).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    counts = Path(args.counts)
    signal.signal(signal.SIGUSR1, lambda *_: counts.write_text(json.dumps(
        {"calls": echo.calls, "messages": echo.messages,
         "threads": {t.name.replace(args.client_id, "ID"): t.native_id for t in threading.enumerate()}})))
    link.start()
    link.open_intake()
    stop.wait()
    link.close_intake()
    link.stop()


def _thread_cpu_s(pid: int, tid: int) -> float:
    try:
        stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def _counts(proc: ConsumerProcess, path: Path) -> Optional[dict]:
    if not path.name:
        return None
    path.unlink(missing_ok=True)
    proc.proc.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 5.0
    while not path.exists() or not path.read_text():
        if time.monotonic() > deadline:
            return None
        time.sleep(0.01)
    return json.loads(path.read_text())


def _snapshot(proc: ConsumerProcess, counts: Path) -> dict:
    found = _counts(proc, counts)
    threads = (found or {}).get("threads", {})
    cpu = {name: _thread_cpu_s(proc.proc.pid, tid) for name, tid in threads.items()}
    return {"cpu_s": process_cpu_s(proc.proc.pid), "threads": cpu, "calls": (found or {}).get("calls", 0),
            "messages": (found or {}).get("messages", 0)}


def _requests(path: Path, n: int, floats: int, first_id: int) -> None:
    values = np.random.default_rng(first_id & 0xFFFF).uniform(-2.0, 2.0, size=(n, floats))
    with open(path, "wb") as out:
        for i, row in enumerate(values):
            data = "[" + ", ".join(f"[{v:.4f}]" for v in row) + "]"
            out.write(b'{"id": %d, "data": %s}\n' % (first_id + i, data.encode()))


def measure(broker: Broker, name: str, cmd: list[str], status_topic: str, files: Path, requests: Path,
            n: int, counts: Path, correlation: Optional[str] = None) -> dict:
    """One consumer: warm up, then a burst of n requests; CPU per reply, overall and per thread."""
    log = files / f"{name}.log"
    collector = Collector(broker.address, REPLY_TOPIC)
    proc = ConsumerProcess(cmd, broker.address, status_topic, log)
    try:
        pub = Publisher(broker.address, correlation)
        pub.send_file(files / "warmup.txt")
        if not collector.wait(lambda: collector.probes >= WARMUP, TIMEOUT_S):
            raise RuntimeError(f"{name}: the warm-up got {collector.probes} of {WARMUP} replies")
        before = _snapshot(proc, counts)
        start = time.perf_counter()
        pub.send_file(requests)
        done = collector.wait(lambda: len(collector.by_id) >= n, TIMEOUT_S)
        after = _snapshot(proc, counts)
        seconds = collector.last_at() - start
        pub.close()
    finally:
        proc.stop()
        collector.close()
    replies = max(len(collector.by_id), 1)
    out = {"consumer": name, "replies": len(collector.by_id), "complete": done,
           "cpu_us_per_reply": round((after["cpu_s"] - before["cpu_s"]) / replies * 1e6, 1),
           "replies_per_s": round(len(collector.by_id) / max(seconds, 1e-9), 1)}
    for thread, cpu in after["threads"].items():
        spent = cpu - before["threads"].get(thread, 0.0)
        if spent > 0:
            out[f"cpu_us[{thread}]"] = round(spent / replies * 1e6, 1)
    calls = after["calls"] - before["calls"]
    if calls:
        out["messages_per_intake_call"] = round((after["messages"] - before["messages"]) / calls, 2)
    return out


def _consumers(args: argparse.Namespace, broker: Broker, files: Path, rnd: int) -> list[tuple]:
    python = sys.executable
    found = []
    if args.echo:
        cid = f"echo-{rnd}"
        found.append(("paho echo", [python, "-m", "daemon.tools.baselines", "echo", "--broker", broker.address,
                                    "--client-id", cid, "--config", str(ROOT / "config.yaml")], cid, Path("")))
    for i, spec in enumerate(args.link):
        cid = f"link{i}-{rnd}"
        counts = files / f"{cid}.counts"
        spec_protocol, _, protocol = spec.partition("#")  # ...#3.1.1: this link on another protocol
        root, _, link = spec_protocol.rpartition("@")  # ROOT@MODULE:CLASS: that tree's copy of this script serves it
        script = _script_in(Path(root)) if root else Path(__file__)
        found.append((spec, [python, str(script), "serve", "--link", link, "--broker", broker.address,
                             "--client-id", cid, "--protocol", protocol or args.protocol, "--reply-from", args.reply_from,
                             "--counts", str(counts)], cid, counts))
    return found


def _script_in(root: Path) -> Path:
    """This script in another checkout: benchmarks/, or scripts/ in one from before the move."""
    moved = root / "benchmarks" / Path(__file__).name
    return moved if moved.exists() else root / "scripts" / Path(__file__).name


def run(args: argparse.Namespace) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-transport-") as tmp:
        files = Path(tmp)
        _requests(files / "warmup.txt", WARMUP, args.floats, -WARMUP)
        with Broker(files / "broker") as broker:
            for rnd in range(args.rounds):
                requests = files / f"requests-{rnd}.txt"
                _requests(requests, args.requests, args.floats, rnd * args.requests)  # distinct in every round
                for name, cmd, cid, counts in _consumers(args, broker, files, rnd):
                    row = measure(broker, name, cmd, f"edge-inferd/{cid}/status", files, requests,
                                  args.requests, counts, args.correlation)
                    row["round"] = rnd
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    return rows


def summary(rows: list[dict]) -> dict:
    """Per consumer, the median over rounds of each figure."""
    out: dict = {}
    for name in dict.fromkeys(r["consumer"] for r in rows):
        mine = [r for r in rows if r["consumer"] == name]
        keys = [k for k in mine[0] if k.startswith(("cpu_us", "replies_per_s", "messages_per"))]
        out[name] = {k: float(np.median([r.get(k, 0.0) for r in mine])) for k in keys}
        out[name]["complete"] = all(r["complete"] for r in mine)
    return out


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd")
    child = sub.add_parser("serve", help="(the child process)")
    child.add_argument("--link", default=DEFAULT_LINK)
    child.add_argument("--broker", required=True)
    child.add_argument("--client-id", required=True)
    child.add_argument("--protocol", default="5", choices=sorted(PROTOCOLS))
    child.add_argument("--reply-from", default="worker", choices=("worker", "loop"))
    child.add_argument("--counts", required=True)
    parser.add_argument("--link", action="append", help=f"MODULE:CLASS, repeatable (default {DEFAULT_LINK})")
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--floats", type=int, default=150)
    parser.add_argument("--protocol", default="5", choices=sorted(PROTOCOLS))
    parser.add_argument("--reply-from", default="worker", choices=("worker", "loop"))
    parser.add_argument("--correlation", help="v5 CorrelationData on every request (and so every reply)")
    parser.add_argument("--no-echo", dest="echo", action="store_false", help="leave out the paho echo")
    args = parser.parse_args(argv)
    if args.cmd == "serve":
        serve(args)
        return
    args.link = args.link or [DEFAULT_LINK]
    print(json.dumps({"median": summary(run(args))}, indent=1))


if __name__ == "__main__":
    main()
