#!/usr/bin/env python3
"""Detection end to end: camera frames through the naive script and the daemon (threads 1 and 2).

    .venv/bin/python scripts/bench_detect.py [--frames 300] [--rounds 3] [--rates 10 0.8x] [--duration 5]
        [--warmup 5] [--out bench-detect] [--models .cache/test-models]

The frames are 640x480 JPEGs (quality 85) made from scikit-image's astronaut, chelsea and
coffee photos (from --models, default $EDGE_INFERD_TEST_MODELS, else .cache/test-models),
each cropped to 4:3 and resized, then shifted by up to SHIFT_PX pixels and given a little
grain per frame, so no two frames are alike (a camera never repeats, and the daemon's result
cache never hits). The route is tests/model/test_real_models.py's camera route on the Coral
SSD MobileNet v2: `input: {format: image, shape: [300, 300, 3], dtype: uint8, resize: stretch}`,
`output: {kind: detect, min_score: 0.5, max_results: 10}`.

One private mosquitto (daemon/tools/broker.py) for the run; one reply collector for the run
(`mosquitto_sub -V 5 -F '%D %p'`, the CorrelationData and the payload of each reply, read and
timestamped by a thread); one paho publisher (MQTT v5, QoS 1, a wide in-flight window, the
frames pre-encoded; each publish carries a fresh CorrelationData, which every consumer echoes).
Each round starts each consumer in turn, as its own process, and stops it after its phases:

- `naive`: `python -m daemon.tools.baselines naive-detect` (Pillow, ai_edge_litert and the
  reply inside paho's `on_message`; the model's `threads: 1`);
- `daemon-t1` / `daemon-t2`: `edge-inferd run` with the model's `threads: 1` / `2` and the
  daemon's defaults otherwise (workers.max = the CPU count, the result cache on, batching's
  defaults), `mqtt.session_expiry_s: 0`; `--set section.key=value` changes one (e.g.
  `--set workers.max_wait_ms=60000`: a burst is queued, not shed).

Phases, per consumer and round, after `--warmup` frames are answered:
- drain: `--frames` frames published as fast as the broker takes them; images/s = results /
  (first publish -> last result); CPU per image = the consumer's utime+stime (all threads,
  /proc) over the same span / results (and / answered); latency = publish -> reply.
- open loop, per `--rates`: frame k published at start + k / rate for `--duration` s;
  "Nx" = N times the naive script's drain rate in the same round; latency p50 / p99.

Each phase also records the cores the consumer used and the cores everything else used
(/proc/stat: the bench, the broker, other work on a shared machine): with 2 cores, a daemon
with 2 workers can outrun the one-threaded naive script only while the rest leaves it a core.

A result is a reply with "detections" (a cache hit is counted apart); anything else is an
error reply, by its code. Progress goes to stderr, the table to stdout, everything to
OUT/bench_detect.json; consumer logs to OUT/logs. Every process started is stopped in
`finally`, and the whole run is bounded by --max-seconds.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import paho.mqtt.client as paho
import yaml
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from PIL import Image, ImageOps

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from daemon.errors import DaemonError  # noqa: E402
from daemon.tools.bench.load import ConsumerProcess, percentiles, require_clients  # noqa: E402
from daemon.tools.bench.phases import start_daemon  # noqa: E402
from daemon.tools.bench.plan import parse_rate  # noqa: E402
from daemon.tools.broker import Broker, end_process  # noqa: E402
from daemon.transport.mqtt import disable_nagle  # noqa: E402

logger = logging.getLogger("bench_detect")

SSD = "ssd_mobilenet_v2_coco_quant.tflite"
LABELS = "coco_labels.txt"
PHOTOS = ("astronaut.png", "chelsea.png", "coffee.png")
FRAME_SIZE = (640, 480)
JPEG_QUALITY = 85
SHIFT_PX = 4  # each frame is its photo moved by up to this many pixels on each axis...
GRAIN = 3  # ...plus uniform grain of up to this many grey levels: no two frames are byte-identical
SEED = 11
REQUEST_TOPIC = "cameras/bench/jpeg"
REPLY_FILTER = "results/#"
ROUTE = "cam"
QOS = 1
INFLIGHT = 65535  # the publisher's window: never the bottleneck (the broker's receive maximum caps it)
SETTLE_S = 10.0  # a phase ends when every frame is answered, or nothing came back for this long
WARMUP_TIMEOUT_S = 120.0
POLL_S = 0.02
DEFAULT_RATES = ("10", "0.8x")
CONSUMERS = ("naive", "daemon-t1", "daemon-t2")
THREADS = {"naive": 1, "daemon-t1": 1, "daemon-t2": 2}
MAX_SECONDS = 3600.0


class Timeout(DaemonError):
    pass


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (all cores, /proc/stat): shows whether other
    work left the consumer a second core."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------------------------
# Frames


class Frames:
    """Frame k: photo k % 3 at 640x480, moved by (dx, dy) and given grain drawn from seed k."""

    def __init__(self, models: Path):
        margin = 2 * SHIFT_PX
        size = (FRAME_SIZE[0] + margin, FRAME_SIZE[1] + margin)
        self._bases = []
        for name in PHOTOS:
            with Image.open(models / name) as photo:
                fitted = ImageOps.fit(photo.convert("RGB"), size, Image.Resampling.LANCZOS)
            self._bases.append(np.asarray(fitted, dtype=np.int16))
        self._cache: dict[int, bytes] = {}

    def subject(self, k: int) -> str:
        return PHOTOS[k % len(PHOTOS)]

    def get(self, k: int) -> bytes:
        found = self._cache.get(k)
        if found is None:
            found = self._cache[k] = self._make(k)
        return found

    def prepare(self, ks) -> None:
        for k in ks:
            self.get(k)

    def _make(self, k: int) -> bytes:
        rng = np.random.default_rng((SEED, k))
        dx, dy = (int(v) for v in rng.integers(0, 2 * SHIFT_PX + 1, size=2))
        width, height = FRAME_SIZE
        crop = self._bases[k % len(self._bases)][dy:dy + height, dx:dx + width]
        grain = rng.integers(-GRAIN, GRAIN + 1, size=crop.shape, dtype=np.int16)
        pixels = np.clip(crop + grain, 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, "JPEG", quality=JPEG_QUALITY)
        return buf.getvalue()


# ---------------------------------------------------------------------------------------------
# Replies in, frames out


@dataclass(frozen=True)
class Reply:
    at: float  # time.perf_counter() when the collector read it
    kind: str  # result | hit | <error code>
    top: Optional[str]  # the best detection's label


def _classify(obj) -> tuple[str, Optional[str]]:
    if not isinstance(obj, dict):
        return "bad_reply", None
    if "detections" in obj:
        best = obj["detections"][0]["label"] if obj["detections"] else None
        return ("hit" if obj.get("cached") else "result"), best
    error = obj.get("error")
    return (error.get("code", "error") if isinstance(error, dict) else "bad_reply"), None


class Collector:
    """Every reply on REPLY_FILTER by its CorrelationData (our decimal ids), timestamped on arrival."""

    def __init__(self, host: str, port: int):
        cmd = ["mosquitto_sub", "-h", host, "-p", str(port), "-q", str(QOS), "-t", REPLY_FILTER, "-V", "5",
               "-D", "CONNECT", "receive-maximum", "65535", "-F", "%D %p"]
        self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.by_id: dict[int, Reply] = {}
        self.unmatched = 0
        self._thread = threading.Thread(target=self._read, name="collector", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self._proc.stdout:
            at = time.perf_counter()
            head, _, payload = line.partition(b" ")
            try:
                request_id = int(head)
                kind, top = _classify(json.loads(payload))
            except ValueError:
                self.unmatched += 1
                continue
            self.by_id.setdefault(request_id, Reply(at, kind, top))

    def settle(self, ids: range, idle_s: float, deadline: float) -> None:
        """Until every id is answered, nothing new came for `idle_s`, or the run's deadline."""
        seen, changed = -1, time.monotonic()
        while not all(i in self.by_id for i in ids):
            now = time.monotonic()
            if now > deadline:
                raise Timeout("the run's --max-seconds passed while waiting for replies")
            count = len(self.by_id)
            if count != seen:
                seen, changed = count, now
            elif now - changed > idle_s:
                return
            time.sleep(POLL_S)

    def close(self) -> None:
        end_process(self._proc)


class Publisher:
    """paho, MQTT v5, QoS 1, a wide in-flight window; each frame with a fresh CorrelationData."""

    def __init__(self, host: str, port: int):
        self._client = paho.Client(CallbackAPIVersion.VERSION2, client_id="", protocol=paho.MQTTv5)
        self._client.max_inflight_messages_set(INFLIGHT)
        self._client.max_queued_messages_set(0)
        self._client.connect(host, port)
        disable_nagle(self._client.socket())
        self._client.loop_start()
        self._infos = []

    def publish(self, request_id: int, payload: bytes) -> None:
        props = Properties(PacketTypes.PUBLISH)
        props.CorrelationData = b"%d" % request_id
        self._infos.append(self._client.publish(REQUEST_TOPIC, payload, qos=QOS, properties=props))

    def confirmed(self, timeout_s: float = 60.0) -> int:
        """How many publishes the broker has acknowledged (waits up to `timeout_s` in all)."""
        deadline = time.monotonic() + timeout_s
        for info in self._infos:
            info.wait_for_publish(max(0.0, deadline - time.monotonic()))
        done = sum(info.is_published() for info in self._infos)
        self._infos.clear()
        return done

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()


# ---------------------------------------------------------------------------------------------
# Consumers


def write_base_config(workdir: Path, models: Path, threads: int) -> Path:
    """The camera route of tests/model/test_real_models.py; everything else is the daemon's default."""
    raw = {"mqtt": {"broker": "127.0.0.1:1883", "qos": QOS, "session_expiry_s": 0},
           "models": {"ssd": {"path": str(models / SSD), "labels": str(models / LABELS), "threads": threads}},
           "routes": [{"name": ROUTE, "subscribe": "cameras/+/jpeg", "model": "ssd", "publish": "results/{1}/objects",
                       "input": {"format": "image", "shape": [300, 300, 3], "dtype": "uint8", "resize": "stretch"},
                       "output": {"kind": "detect", "min_score": 0.5, "max_results": 10}}]}
    path = workdir / f"base-t{threads}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def parse_sets(texts: list[str]) -> dict:
    """`--set section.key=value` (value read as YAML) -> start_daemon's overrides."""
    overrides: dict = {}
    for text in texts:
        name, sep, value = text.partition("=")
        section, dot, key = name.partition(".")
        if not sep or not dot or not section or not key:
            raise ValueError(f"--set {text!r}: expected section.key=value (e.g. workers.max_wait_ms=60000)")
        overrides.setdefault(section, {})[key] = yaml.safe_load(value)
    return overrides


def start_consumer(name: str, base: Path, workdir: Path, address: str, overrides: dict) -> ConsumerProcess:
    client_id = f"bench-{workdir.name}"
    log = workdir / "consumer.log"
    if name == "naive":
        cmd = [sys.executable, "-m", "daemon.tools.baselines", "naive-detect", "--broker", address,
               "--config", str(base), "--route", ROUTE, "--client-id", client_id]
        env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        return ConsumerProcess(cmd, address, f"edge-inferd/{client_id}/status", log, env=env)
    return start_daemon(base, workdir, client_id, overrides, address, log, pythonpath=ROOT)


# ---------------------------------------------------------------------------------------------
# Phases


@dataclass
class Run:
    address: str
    host: str
    port: int
    frames: Frames
    collector: Collector
    deadline: float
    warmup: int
    _next_id: int = 0
    results: dict = field(default_factory=dict)

    def ids(self, n: int) -> range:
        first, self._next_id = self._next_id, self._next_id + n
        return range(first, first + n)

    def warm(self, consumer: ConsumerProcess, first_frame: int) -> None:
        """`--warmup` frames (never measured frames) answered: connected, subscribed, warmed up."""
        ids = self.ids(self.warmup)
        pub = Publisher(self.host, self.port)
        try:
            for n, i in enumerate(ids):
                pub.publish(i, self.frames.get(first_frame + n))
            limit = min(self.deadline, time.monotonic() + WARMUP_TIMEOUT_S)
            while not all(i in self.collector.by_id for i in ids):
                if consumer.proc.poll() is not None:
                    raise DaemonError(f"consumer exited with {consumer.proc.returncode}; see {consumer.log}")
                if time.monotonic() > limit:
                    raise Timeout(f"warm-up frames unanswered after {WARMUP_TIMEOUT_S:.0f}s; see {consumer.log}")
                time.sleep(POLL_S)
        finally:
            pub.close()

    def phase(self, consumer: ConsumerProcess, frame_ks: list[int], rate: Optional[float]) -> dict:
        """Publish frames `frame_ks` (all at once, or at `rate`/s), wait for the replies, summarise."""
        self.frames.prepare(frame_ks)
        ids = self.ids(len(frame_ks))
        sent_at: dict[int, float] = {}
        pub = Publisher(self.host, self.port)
        try:
            cpu0, busy0, start = consumer.cpu_s(), machine_busy_s(), time.perf_counter()
            for n, (i, k) in enumerate(zip(ids, frame_ks)):
                if rate is not None:
                    delay = start + n / rate - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                sent_at[i] = time.perf_counter()
                pub.publish(i, self.frames.get(k))
            sent_s = time.perf_counter() - start
            self.collector.settle(ids, SETTLE_S, self.deadline)
            cpu, busy = consumer.cpu_s() - cpu0, machine_busy_s() - busy0
            wall = time.perf_counter() - start
            confirmed = pub.confirmed()
        finally:
            pub.close()
        point = summarise(self.collector, ids, frame_ks, self.frames, sent_at, start, sent_s, cpu, confirmed)
        # Cores in use over the phase: the consumer's, and everything else's (the bench, the broker, other work).
        point.update(consumer_cores=round(cpu / wall, 2), other_cores=round(max(busy - cpu, 0.0) / wall, 2))
        return point


def summarise(collector: Collector, ids: range, frame_ks: list[int], frames: Frames, sent_at: dict,
              start: float, sent_s: float, cpu: float, confirmed: int) -> dict:
    counts: dict[str, int] = {}
    latency, last, agree = [], start, 0
    for i, k in zip(ids, frame_ks):
        reply = collector.by_id.get(i)
        if reply is None:
            continue
        counts[reply.kind] = counts.get(reply.kind, 0) + 1
        if reply.kind in ("result", "hit"):
            latency.append((reply.at - sent_at[i]) * 1000.0)
            last = max(last, reply.at)
            agree += reply.top == _SUBJECT_LABEL[frames.subject(k)]
    results = counts.get("result", 0) + counts.get("hit", 0)
    answered = sum(counts.values())
    seconds = max(last - start, 1e-9)
    return {"sent": len(ids), "confirmed": confirmed, "answered": answered, "results": results,
            "cache_hits": counts.get("hit", 0),
            "errors": {k: v for k, v in counts.items() if k not in ("result", "hit")},
            "lost": len(ids) - answered, "top_label_matches_photo": agree,
            "offered_rps": round(len(ids) / max(sent_s, 1e-9), 2), "seconds": round(seconds, 3),
            "images_per_s": round(results / seconds, 2) if results else 0.0,
            "cpu_s": round(cpu, 3),
            "cpu_ms_per_image": round(cpu / results * 1e3, 2) if results else None,
            "cpu_ms_per_answered": round(cpu / answered * 1e3, 2) if answered else None,
            "latency_ms": percentiles(latency)}


_SUBJECT_LABEL = {"astronaut.png": "person", "chelsea.png": "cat", "coffee.png": "cup"}


def one_consumer(run: Run, name: str, base: Path, workdir: Path, n_frames: int, rates: list[str],
                 duration: float, naive_rps: Optional[float], logs: Path, out: dict, overrides: dict) -> None:
    """Start `name`, run its phases into `out` (what was measured stays there on an error), stop it."""
    logger.info("%s: starting", name)
    consumer = start_consumer(name, base, workdir, run.address, overrides)
    try:
        run.warm(consumer, first_frame=0)
        first = run.warmup
        logger.info("%s: drain, %d frames", name, n_frames)
        out["drain"] = run.phase(consumer, list(range(first, first + n_frames)), None)
        first += n_frames
        _log_point(name, "drain", out["drain"])
        if name == "naive":
            naive_rps = out["drain"]["images_per_s"]
        out["openloop"] = []
        for text in rates:
            rate, _ = parse_rate(text, naive_rps or 0.0)
            if rate <= 0:
                raise DaemonError(f"rate {text!r} needs the naive drain rate, which this round lacks")
            count = max(1, int(round(rate * duration)))
            logger.info("%s: open loop at %.1f frames/s (%s) for %.1fs", name, rate, text, duration)
            point = run.phase(consumer, list(range(first, first + count)), rate)
            first += count
            point.update(rate_spec=text, rate=round(rate, 2))
            _log_point(name, f"open loop {text}", point)
            out["openloop"].append(point)
    finally:
        code = consumer.stop()
        shutil.copy(consumer.log, logs / f"{workdir.name}.log")
        out["exit_code"] = code


def _log_point(name: str, what: str, p: dict) -> None:
    logger.info("%s: %s: %d/%d results, %.1f images/s, %s ms CPU/image, p50 %s p99 %s ms, errors %s, lost %d; "
                "cores: consumer %.2f, the rest %.2f", name, what, p["results"], p["sent"], p["images_per_s"],
                p["cpu_ms_per_image"], p["latency_ms"]["p50"], p["latency_ms"]["p99"], p["errors"] or 0, p["lost"],
                p["consumer_cores"], p["other_cores"])


# ---------------------------------------------------------------------------------------------
# Report


def _spread(values: list) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    text = f"{statistics.median(values):.2f}"
    return text + (f" ({min(values):.2f}-{max(values):.2f})" if len(values) > 1 else "")


def aggregate(rounds: list[dict], rates: list[str]) -> dict:
    """Per consumer, medians over rounds; ratios to naive taken within each round, then their median."""
    summary: dict = {}
    for name in CONSUMERS:
        rows = [r[name] for r in rounds if name in r and "drain" in r[name]]
        if not rows:
            continue
        entry = {"drain": {}, "openloop": {}}
        for key in ("images_per_s", "cpu_ms_per_image", "cpu_ms_per_answered"):
            entry["drain"][key] = [row["drain"][key] for row in rows]
        entry["drain"]["p99_ms"] = [row["drain"]["latency_ms"]["p99"] for row in rows]
        entry["drain"]["other_cores"] = [row["drain"]["other_cores"] for row in rows]
        entry["drain"]["results"] = [row["drain"]["results"] for row in rows]
        entry["drain"]["sent"] = [row["drain"]["sent"] for row in rows]
        entry["drain"]["errors"] = [row["drain"]["errors"] for row in rows]
        ratios = [(r[name]["drain"], r["naive"]["drain"]) for r in rounds
                  if name in r and "naive" in r and "drain" in r[name] and "drain" in r["naive"]]
        entry["drain"]["rate_vs_naive"] = [round(d["images_per_s"] / n["images_per_s"], 3)
                                           for d, n in ratios if n["images_per_s"]]
        entry["drain"]["cpu_vs_naive"] = [round(d["cpu_ms_per_image"] / n["cpu_ms_per_image"], 3)
                                          for d, n in ratios if d["cpu_ms_per_image"] and n["cpu_ms_per_image"]]
        for j, text in enumerate(rates):
            points = [row["openloop"][j] for row in rows if len(row.get("openloop", [])) > j]
            entry["openloop"][text] = {
                "rate": [p["rate"] for p in points],
                "p50_ms": [p["latency_ms"]["p50"] for p in points],
                "p99_ms": [p["latency_ms"]["p99"] for p in points],
                "results": [p["results"] for p in points], "sent": [p["sent"] for p in points],
                "cpu_ms_per_image": [p["cpu_ms_per_image"] for p in points],
                "errors": [p["errors"] for p in points]}
        summary[name] = entry
    return summary


def per_round(rounds: list[dict]) -> str:
    """Each round's drain: images/s, CPU ms/image, results and the cores the rest of the machine took."""
    lines = ["drain per round: images/s, CPU ms/image, results/sent, other cores"]
    for r, this in enumerate(rounds, 1):
        cells = [f"{name} {m['drain']['images_per_s']:.1f}/s {m['drain']['cpu_ms_per_image']} ms "
                 f"{m['drain']['results']}/{m['drain']['sent']} {m['drain']['other_cores']:.2f}"
                 for name, m in this.items() if "drain" in m]
        lines.append(f"round {r}: " + " | ".join(cells))
    return "\n".join(lines)


def table(summary: dict, rates: list[str]) -> str:
    lines = ["drain (median over rounds, min-max in brackets; ratios to naive within each round)",
             f"{'consumer':<10} {'images/s':>20} {'x naive':>18} {'CPU ms/image':>22} {'x naive':>18} "
             f"{'p99 ms':>22} {'results/sent':>14} {'other cores':>18}"]
    for name, e in summary.items():
        d = e["drain"]
        errors = sum(sum(x.values()) for x in d["errors"])
        lines.append(f"{name:<10} {_spread(d['images_per_s']):>20} {_spread(d['rate_vs_naive']):>18} "
                     f"{_spread(d['cpu_ms_per_image']):>22} {_spread(d['cpu_vs_naive']):>18} "
                     f"{_spread(d['p99_ms']):>22} {sum(d['results']):>7}/{sum(d['sent']):<6} "
                     f"{_spread(d['other_cores']):>18}"
                     + (f"  errors {errors}" if errors else ""))
    for text in rates:
        lines.append("")
        lines.append(f"open loop {text} (median over rounds)")
        lines.append(f"{'consumer':<10} {'frames/s':>10} {'p50 ms':>20} {'p99 ms':>22} {'CPU ms/image':>22} "
                     f"{'results/sent':>14}")
        for name, e in summary.items():
            o = e["openloop"].get(text)
            if not o or not o["sent"]:
                continue
            errors = sum(sum(x.values()) for x in o["errors"])
            lines.append(f"{name:<10} {_spread(o['rate']).split(' ')[0]:>10} {_spread(o['p50_ms']):>20} "
                         f"{_spread(o['p99_ms']):>22} {_spread(o['cpu_ms_per_image']):>22} "
                         f"{sum(o['results']):>7}/{sum(o['sent'])}" + (f"  errors {errors}" if errors else ""))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------


def _default_models() -> Path:
    return Path(os.environ.get("EDGE_INFERD_TEST_MODELS") or ROOT / ".cache" / "test-models")


def _sigterm(*_):
    raise KeyboardInterrupt("SIGTERM")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=300, help="frames in the drain burst (default 300)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of naive, daemon-t1, daemon-t2 (default 3)")
    parser.add_argument("--rates", nargs="*", default=list(DEFAULT_RATES),
                        help="open-loop rates: frames/s, or Nx = N times the round's naive drain rate "
                             "(default 10 0.8x); none: no open loop")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per open-loop point (default 5)")
    parser.add_argument("--warmup", type=int, default=5, help="frames answered before each consumer's phases")
    parser.add_argument("--consumers", nargs="+", choices=CONSUMERS, default=list(CONSUMERS))
    parser.add_argument("--out", type=Path, default=Path("bench-detect"), help="directory for the JSON and logs")
    parser.add_argument("--models", type=Path, default=_default_models(),
                        help="the fetched test models and photos (default $EDGE_INFERD_TEST_MODELS or .cache/test-models)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="a daemon config override, e.g. workers.max_wait_ms=60000 (default: none, the "
                             "daemon's defaults); repeatable")
    parser.add_argument("--max-seconds", type=float, default=MAX_SECONDS, help="bound on the whole run")
    args = parser.parse_args(argv)
    if args.frames < 1 or args.rounds < 1 or args.warmup < 1 or args.duration <= 0:
        parser.error("--frames, --rounds and --warmup must be at least 1, --duration above 0")
    for text in args.rates:
        parse_rate(text, 1.0)
    try:
        overrides = parse_sets(args.set)
    except ValueError as exc:
        parser.error(str(exc))
    if any(t.endswith("x") for t in args.rates) and "naive" not in args.consumers:
        parser.error("an Nx rate needs the naive consumer")
    missing = [n for n in (SSD, LABELS, *PHOTOS) if not (args.models / n).is_file()]
    if missing:
        parser.error(f"{args.models} lacks {', '.join(missing)}: run ./scripts/fetch_test_models.sh")
    consumers = [c for c in CONSUMERS if c in args.consumers]  # naive first: the Nx rates need its drain
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    require_clients()
    signal.signal(signal.SIGTERM, _sigterm)

    args.out.mkdir(parents=True, exist_ok=True)
    logs = args.out / "logs"
    logs.mkdir(exist_ok=True)
    began = time.monotonic()
    deadline = began + args.max_seconds
    rounds: list[dict] = []
    errors: list[str] = []
    collector = broker = None
    with tempfile.TemporaryDirectory(prefix="bench-detect-") as tmp:
        work = Path(tmp)
        try:
            broker = Broker(work / "broker").start()
            host, port = broker.address.rsplit(":", 1)
            collector = Collector(host, int(port))
            frames = Frames(args.models)
            bases = {name: write_base_config(work, args.models.resolve(), THREADS[name]) for name in consumers}
            run = Run(broker.address, host, int(port), frames, collector, deadline, args.warmup)
            logger.info("making frames: %d warm-up + %d drain", args.warmup, args.frames)
            frames.prepare(range(args.warmup + args.frames))
            for r in range(args.rounds):
                this: dict = {}
                rounds.append(this)
                for name in consumers:
                    if time.monotonic() > deadline:
                        raise Timeout("--max-seconds passed")
                    workdir = work / f"{name}-r{r + 1}"
                    workdir.mkdir()
                    logger.info("round %d of %d", r + 1, args.rounds)
                    naive_rps = this.get("naive", {}).get("drain", {}).get("images_per_s")
                    this[name] = {}
                    try:
                        one_consumer(run, name, bases[name], workdir, args.frames, args.rates,
                                     args.duration, naive_rps, logs, this[name], overrides)
                    except Timeout:
                        raise
                    except DaemonError as exc:  # record it and go on with the others
                        logger.warning("%s, round %d: %s", name, r + 1, exc)
                        errors.append(f"{name} round {r + 1}: {exc}")
                        this[name]["error"] = str(exc)
        except (Timeout, KeyboardInterrupt) as exc:
            logger.warning("stopped early: %s", exc)
            errors.append(f"stopped early: {exc}")
        finally:
            if collector is not None:
                collector.close()
            if broker is not None:
                broker.close()
    summary = aggregate(rounds, args.rates)
    report = {"command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
              "frames": args.frames, "rounds_run": len(rounds), "rates": args.rates, "duration_s": args.duration,
              "warmup": args.warmup, "daemon_overrides": overrides, "frame": {"size": FRAME_SIZE, "jpeg_quality": JPEG_QUALITY,
                                                "shift_px": SHIFT_PX, "grain": GRAIN,
                                                "mean_bytes": _mean_bytes(frames) if rounds else None},
              "cpus": os.cpu_count(), "seconds": round(time.monotonic() - began, 1),
              "summary": summary, "rounds": rounds, "errors": errors}
    (args.out / "bench_detect.json").write_text(json.dumps(report, indent=2))
    print(table(summary, args.rates))
    print()
    print(per_round(rounds))
    if errors:
        print("errors: " + "; ".join(errors))
    logger.info("wrote %s in %.0fs", args.out / "bench_detect.json", time.monotonic() - began)
    return 1 if errors else 0


def _mean_bytes(frames: Frames) -> int:
    sizes = [len(b) for b in frames._cache.values()]
    return int(sum(sizes) / len(sizes)) if sizes else 0


if __name__ == "__main__":
    sys.exit(main())
