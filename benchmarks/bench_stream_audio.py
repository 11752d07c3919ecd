"""Streamed audio side by side: openWakeWord's chain on N microphones' pcm16 chunks, the daemon's
stream route with `stages` against the same chain inline in a naive paho script.

    EDGE_INFERD_TEST_MODELS=.cache/test-models PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_stream_audio.py \\
        [--devices 4] [--seconds 20] [--rounds 3] [--out results.json]

One private mosquitto; one paced publisher (a paho client in this process, not the consumer's)
sending each microphone's 80 ms pcm16 chunks (1280 samples at 16 kHz, 2560 bytes) in real time,
QoS 1, on `mic/<device>/pcm`. Each microphone's audio is a noise floor (std 30 int16 units) with
espeak-ng speech in it (tests/speech.py): "hey jarvis" on the first, other words on the rest. A
`mosquitto_sub` collects the replies on `wake/+`. Each consumer runs alone, the order turning
each round:
- `daemon`: config.yaml as written, its models and routes replaced by the chain (melspectrogram
  with `max_batch: 1`, embedding, hey_jarvis: tests/model/test_stages_chain.py) on one pcm16
  stream route (windows of 2 s every 0.25 s, as tests/integration/test_stream_audio.py), and a
  clean session each run;
- `naive`: `python -m daemon.tools.baselines naive-audio` (paho's defaults, a per-device array of
  samples, the three models invoked inline on each window as it completes, the same scaling).
Reported per consumer: its process CPU over the run (utime + stime, /proc) per second of audio
(all microphones' audio summed: the real time factor), the cores it kept busy (CPU s per second
of the stream), the windows answered against those expected, and the best score per microphone.
The daemon's per-window scores are checked against the naive script's (within 1e-4).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import paho.mqtt.client as paho
import yaml
from paho.mqtt.enums import CallbackAPIVersion

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from daemon.tools.bench.load import (Collector, ConsumerProcess, end_session,  # noqa: E402
                                     require_clients)
from daemon.tools.broker import Broker  # noqa: E402
from daemon.transport.mqtt import stop_loop  # noqa: E402
from tests.model.test_stages_chain import SCORE_TOLERANCE, chain_config  # noqa: E402
from tests.speech import RATE, speech  # noqa: E402

TOPIC, REPLIES, ROUTE = "mic/{}/pcm", "wake/+", "wake-stream"
CHUNK = 1280  # 80 ms at 16 kHz: what openWakeWord's own streaming feeds
CHUNK_S = CHUNK / RATE
WINDOW, HOP = 2 * RATE, RATE // 4  # 2 s windows every 0.25 s
FLOOR = 30.0  # a microphone's noise floor, in int16 units (digital silence is not what a microphone sends)
WAKE_WORD, OTHER_WORDS = "hey jarvis", ("good morning", "turn on the lights", "what time is it", "play some music")
SPEECH_EVERY_S = 5.0  # one phrase this often, the first at 1 s
WARM_DEVICE = "warm"  # one window of its own before the measured run: the consumer is serving
QOS = 1
SETTLE_S = 5.0  # no new reply for this long after the last publish: the consumer is done
WARM_TIMEOUT_S = 60.0
PUBLISH_TIMEOUT_S = 30.0


def write_config(tmp: Path) -> Path:
    """config.yaml as written, with the chain's models and one pcm16 stream route on them."""
    raw = yaml.safe_load((ROOT / "config.yaml").read_text())
    (tmp / "chain").mkdir()
    chain = yaml.safe_load(chain_config(tmp / "chain").read_text())
    route = {**chain["routes"][0], "name": ROUTE, "subscribe": TOPIC.format("+"), "publish": "wake/{1}",
             "input": {"format": "pcm16", "sample_rate": RATE, "shape": [WINDOW], "stream": {"hop": HOP}},
             "preprocess": [{"normalize": {"std": 1 / 32768}}]}  # back to int16 units, as the model takes them
    raw["models"], raw["routes"] = chain["models"], [route]
    raw["mqtt"] = {**raw["mqtt"], "client_id": "bench-daemon", "session_expiry_s": 0,
                   "outbox": {"dir": str(tmp / "outbox")}}
    raw["cache"] = {**(raw.get("cache") or {}), "dir": str(tmp / "cache")}
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def microphone(text: str | None, seconds: float, seed: int) -> np.ndarray:
    """`seconds` of floor with `text` (or nothing) said at 1 s and every SPEECH_EVERY_S after: int16 samples."""
    floor = np.random.default_rng(seed).standard_normal(int(seconds * RATE)) * FLOOR
    voice = speech(text) if text else np.zeros(0, np.int16)
    for start in np.arange(1.0, seconds, SPEECH_EVERY_S):
        at = int(start * RATE)
        said = voice[:len(floor) - at]
        floor[at:at + len(said)] += said
    return np.clip(np.round(floor), -32768, 32767).astype(np.int16)


def chunks(signal: np.ndarray) -> list[bytes]:
    usable = len(signal) - len(signal) % CHUNK
    return [signal[i:i + CHUNK].astype("<i2").tobytes() for i in range(0, usable, CHUNK)]


def streams(devices: int, seconds: float) -> dict[str, list[bytes]]:
    """Each microphone's chunks: the wake word on the first, other words on the rest."""
    texts = [WAKE_WORD] + [OTHER_WORDS[(d - 1) % len(OTHER_WORDS)] for d in range(1, devices)]
    return {f"m{d}": chunks(microphone(text, seconds, d)) for d, text in enumerate(texts)}


class Publisher:
    """A paho client of this process (not the consumer's CPU): every microphone's chunk of each
    80 ms tick, paced in real time."""

    def __init__(self, address: str):
        host, port = address.rsplit(":", 1)
        self._client = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
        self._client.connect(host, int(port))
        self._client.loop_start()

    def send(self, device: str, payloads: list[bytes]) -> None:
        for payload in payloads:
            self._client.publish(TOPIC.format(device), payload, qos=QOS)

    def paced(self, by_device: dict[str, list[bytes]]) -> float:
        """Publish tick by tick in real time; the seconds it took."""
        started, infos = time.monotonic(), []
        ticks = max(len(c) for c in by_device.values())
        for tick in range(ticks):
            pause = started + tick * CHUNK_S - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            infos += [self._client.publish(TOPIC.format(device), c[tick], qos=QOS)
                      for device, c in by_device.items() if tick < len(c)]
        for info in infos:
            info.wait_for_publish(PUBLISH_TIMEOUT_S)
        return time.monotonic() - started

    def close(self) -> None:
        self._client.disconnect()
        stop_loop(self._client)


class WindowCollector(Collector):
    """Every window's reply by microphone: (the window's number or its last sample's time, score)."""

    def __init__(self, *args):
        self.windows: dict[str, list[tuple[float, float]]] = {}
        super().__init__(*args)

    def _arrived(self, at: float, obj) -> None:
        if isinstance(obj, dict) and "stream" in obj and "score" in obj:
            # The daemon's windows carry their last sample's time (pcm16 has no seq); naive-audio's, their number.
            order = obj.get("last_at", obj.get("window"))
            self.windows.setdefault(obj["stream"], []).append((order, obj["score"]))
        else:
            super()._arrived(at, obj)

    def count(self, devices) -> int:
        return sum(len(self.windows.get(d, ())) for d in devices)

    def scores(self, device: str) -> list[float]:
        """The microphone's scores in window order (the daemon's by the windows' last sample)."""
        return [score for _, score in sorted(self.windows.get(device, ()))]


def consumer_command(kind: str, address: str, config: Path) -> tuple[list[str], str]:
    if kind == "daemon":
        return [sys.executable, "-m", "daemon", "run", "--config", str(config), "--broker", address], "bench-daemon"
    return [sys.executable, "-m", "daemon.tools.baselines", "naive-audio", "--broker", address,
            "--config", str(config), "--route", ROUTE, "--client-id", kind], kind


def windows_of(payloads: list[bytes]) -> int:
    return max(0, (len(payloads) * CHUNK - WINDOW) // HOP + 1)


def run_one(kind: str, address: str, config: Path, by_device: dict[str, list[bytes]], warm: list[bytes],
            tmp: Path) -> tuple[dict, dict]:
    """One consumer alone: its figures, and its scores per microphone in window order."""
    cmd, client_id = consumer_command(kind, address, config)
    status = f"edge-inferd/{client_id}/status"
    collector = WindowCollector(address, REPLIES)
    consumer = ConsumerProcess(cmd, address, status, tmp / f"{kind}.log", env={"PYTHONPATH": str(ROOT)})
    pub = Publisher(address)
    expected = sum(windows_of(c) for c in by_device.values())
    try:
        pub.send(WARM_DEVICE, warm)  # its window's reply: subscribed, the models loaded and serving
        if not collector.wait(lambda: WARM_DEVICE in collector.windows, WARM_TIMEOUT_S):
            raise SystemExit(f"{kind}: the warm-up window was not answered within {WARM_TIMEOUT_S:g} s")
        before = consumer.cpu_s()
        wall = pub.paced(by_device)
        collector.settle(lambda: collector.count(by_device) >= expected, SETTLE_S)
        cpu = consumer.cpu_s() - before
    finally:
        pub.close()
        consumer.stop()
        collector.close()
        if kind == "daemon":
            end_session(address, client_id)
    scores = {d: collector.scores(d) for d in by_device}
    audio_s = sum(len(c) for c in by_device.values()) * CHUNK_S
    figures = {"cpu_s": round(cpu, 3), "audio_s": round(audio_s, 2), "publish_s": round(wall, 2),
               "rtf": round(cpu / audio_s, 4), "cores": round(cpu / wall, 3),
               "windows": collector.count(by_device), "expected": expected,
               "best": {d: round(max(s, default=float("nan")), 4) for d, s in scores.items()}}
    return figures, scores


def compare(daemon: dict[str, list[float]], naive: dict[str, list[float]]) -> dict:
    """Window by window, where both answered every window of a microphone."""
    same_count = [d for d in daemon if len(daemon[d]) == len(naive[d])]
    diffs = [abs(a - b) for d in same_count for a, b in zip(daemon[d], naive[d])]
    worst = max(diffs, default=float("nan"))
    return {"windows_compared": len(diffs), "max_score_difference": worst,
            "within_tolerance": bool(diffs) and worst <= SCORE_TOLERANCE,
            "microphones_not_compared": sorted(set(daemon) - set(same_count))}


def summary(rounds: list[dict]) -> dict:
    """Per consumer, the medians over rounds."""
    return {kind: {key: statistics.median(r[kind][key] for r in rounds) for key in ("rtf", "cores", "cpu_s")}
            for kind in ("daemon", "naive")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    require_clients()
    by_device = streams(args.devices, args.seconds)
    warm = chunks(microphone(None, WINDOW / RATE, seed=args.devices))  # a seed no microphone has
    order, rounds = ["daemon", "naive"], []
    with tempfile.TemporaryDirectory(prefix="bench-stream-audio-") as tmp, Broker() as broker:
        config = write_config(Path(tmp))
        for n in range(args.rounds):
            figures, scores = {}, {}
            for kind in order:
                print(f"round {n + 1}: {kind}", file=sys.stderr, flush=True)
                figures[kind], scores[kind] = run_one(kind, broker.address, config, by_device, warm, Path(tmp))
            figures["daemon_vs_naive"] = compare(scores["daemon"], scores["naive"])
            figures["rtf_ratio"] = round(figures["daemon"]["rtf"] / figures["naive"]["rtf"], 3)
            rounds.append(figures)
            order = order[1:] + order[:1]
    report = {"devices": args.devices, "seconds": args.seconds, "chunk_samples": CHUNK, "window": WINDOW,
              "hop": HOP, "median": summary(rounds), "rounds": rounds}
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
