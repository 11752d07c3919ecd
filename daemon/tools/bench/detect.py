"""Detection end to end, the machinery of benchmarks/bench_detect.py: camera frames, the reply
collector, the publisher, one consumer's start and one phase's measurement.

Frame k is photo k % 3 (from the test models' folder) fitted to 640x480, shifted by up to
SHIFT_PX pixels and given grain drawn from seed k, as a JPEG: no two frames are alike, so the
daemon's result cache never hits. Every request carries a fresh CorrelationData (a decimal id),
which every consumer echoes; the collector matches replies to requests by it.
"""

from __future__ import annotations

import io
import json
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import paho.mqtt.client as paho
import yaml
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from PIL import Image, ImageOps

from daemon.errors import DaemonError
from daemon.tools.bench.load import ConsumerProcess, percentiles, subscriber
from daemon.tools.bench.phases import start_daemon
from daemon.tools.demo_camera import COCO_LABELS, SSD
from daemon.tools.demo_camera import PHOTOS as CAMERA_PHOTOS
from daemon.tools.broker import end_process
from daemon.transport.mqtt import disable_nagle, stop_loop

# The demo's camera files (demo_camera.py): the SSD, its labels, and each photo with its subject.
LABELS = COCO_LABELS
PHOTOS = tuple(photo for photo, _, _ in CAMERA_PHOTOS)
_SUBJECT_LABEL = {photo: label for photo, label, _ in CAMERA_PHOTOS}
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

    def mean_bytes(self) -> int:
        """The mean size of the frames made so far (0 before any)."""
        sizes = [len(b) for b in self._cache.values()]
        return int(sum(sizes) / len(sizes)) if sizes else 0

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
        self._proc = subscriber(f"{host}:{port}", REPLY_FILTER, "-F", "%D %p")  # CorrelationData, payload
        self.by_id: dict[int, Reply] = {}
        self._thread = threading.Thread(target=self._read, name="collector", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self._proc.stdout:
            at = time.perf_counter()
            head, _, payload = line.partition(b" ")
            try:
                request_id = int(head)
                kind, top = _classify(json.loads(payload))
            except ValueError:  # not one of ours (no decimal CorrelationData, or not JSON)
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
        stop_loop(self._client)


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


def start_consumer(name: str, base: Path, workdir: Path, address: str, overrides: dict,
                   root: Path) -> ConsumerProcess:
    """`naive` (daemon.tools.baselines) or the daemon, as its own process; `root` goes on its
    PYTHONPATH so either runs from a checkout."""
    client_id = f"bench-{workdir.name}"
    log = workdir / "consumer.log"
    if name == "naive":
        cmd = [sys.executable, "-m", "daemon.tools.baselines", "naive-detect", "--broker", address,
               "--config", str(base), "--route", ROUTE, "--client-id", client_id,
               "--protocol", "5"]  # v5: the replies carry the frames' CorrelationData
        env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
        return ConsumerProcess(cmd, address, f"edge-inferd/{client_id}/status", log, env=env)
    return start_daemon(base, workdir, client_id, overrides, address, log, pythonpath=root)


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


