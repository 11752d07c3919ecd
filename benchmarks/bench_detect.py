#!/usr/bin/env python3
"""Detection end to end: camera frames through the naive script and the daemon (threads 1 and 2).

    .venv/bin/python benchmarks/bench_detect.py [--frames 300] [--rounds 3] [--rates 10 0.8x] [--duration 5]
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

- `naive`: `python -m daemon.tools.baselines naive-detect` (Pillow, ai_edge_litert (tflite_runtime
  where litert is not installed, as on armv7) and the reply inside paho's `on_message`; the
  model's `threads: 1`);
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
`finally`, and the whole run is bounded by --max-seconds. The frames, the collector, the
publisher and one phase's measurement are daemon/tools/bench/detect.py; this script is the
plan of the run and its report.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from daemon.errors import DaemonError  # noqa: E402
from daemon.tools.bench.detect import (  # noqa: E402
    FRAME_SIZE, GRAIN, JPEG_QUALITY, SHIFT_PX, Collector, Frames, Run, Timeout, start_consumer,
    write_base_config)
from daemon.tools.bench.load import require_clients  # noqa: E402
from daemon.tools.bench.plan import parse_rate  # noqa: E402
from daemon.tools.broker import Broker  # noqa: E402
from daemon.tools.demo_camera import missing, models_dir  # noqa: E402

logger = logging.getLogger("bench_detect")

DEFAULT_RATES = ("10", "0.8x")
CONSUMERS = ("naive", "daemon-t1", "daemon-t2")
THREADS = {"naive": 1, "daemon-t1": 1, "daemon-t2": 2}
MAX_SECONDS = 3600.0


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



def one_consumer(run: Run, name: str, base: Path, workdir: Path, n_frames: int, rates: list[str],
                 duration: float, naive_rps: Optional[float], logs: Path, out: dict, overrides: dict) -> None:
    """Start `name`, run its phases into `out` (what was measured stays there on an error), stop it."""
    logger.info("%s: starting", name)
    consumer = start_consumer(name, base, workdir, run.address, overrides, ROOT)
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


def _sigterm(*_):
    raise KeyboardInterrupt("SIGTERM")



def _parser() -> argparse.ArgumentParser:
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
    parser.add_argument("--models", type=Path, default=models_dir(),
                        help="the fetched test models and photos (default $EDGE_INFERD_TEST_MODELS or .cache/test-models)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="a daemon config override, e.g. workers.max_wait_ms=60000 (default: none, the "
                             "daemon's defaults); repeatable")
    parser.add_argument("--max-seconds", type=float, default=MAX_SECONDS, help="bound on the whole run")
    return parser


def _parse_args(parser: argparse.ArgumentParser, argv: Optional[list[str]]) -> tuple[argparse.Namespace, dict]:
    """The command line and the daemon overrides, all checked before any process starts."""
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
    lacking = missing(args.models)
    if lacking:
        parser.error(f"{args.models} lacks {', '.join(lacking)}: run ./scripts/fetch_test_models.sh")
    return args, overrides


def _one_round(run: Run, r: int, args: argparse.Namespace, consumers: list[str], bases: dict, work: Path,
               logs: Path, overrides: dict, this: dict, errors: list[str]) -> None:
    """Round `r`'s consumers in turn, into `this`; a consumer's error is recorded and the others
    go on, but the run's deadline stops it all."""
    for name in consumers:
        if time.monotonic() > run.deadline:
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


def _measure(args: argparse.Namespace, consumers: list[str], overrides: dict, logs: Path, deadline: float,
             rounds: list[dict], errors: list[str]) -> Optional[Frames]:
    """Every round, into `rounds` (a round is there from its start: what an early stop cut short
    is kept); the frames made, or None where the run stopped before making them."""
    frames = collector = broker = None
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
                _one_round(run, r, args, consumers, bases, work, logs, overrides, this, errors)
        except (Timeout, KeyboardInterrupt) as exc:
            logger.warning("stopped early: %s", exc)
            errors.append(f"stopped early: {exc}")
        finally:
            if collector is not None:
                collector.close()
            if broker is not None:
                broker.close()
    return frames


def _report(args: argparse.Namespace, argv: Optional[list[str]], overrides: dict, frames: Optional[Frames],
            began: float, summary: dict, rounds: list[dict], errors: list[str]) -> dict:
    """What OUT/bench_detect.json holds."""
    return {"command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
            "frames": args.frames, "rounds_run": len(rounds), "rates": args.rates, "duration_s": args.duration,
            "warmup": args.warmup, "daemon_overrides": overrides, "frame": {"size": FRAME_SIZE, "jpeg_quality": JPEG_QUALITY,
                                              "shift_px": SHIFT_PX, "grain": GRAIN,
                                              "mean_bytes": frames.mean_bytes() if rounds else None},
            "cpus": os.cpu_count(), "seconds": round(time.monotonic() - began, 1),
            "summary": summary, "rounds": rounds, "errors": errors}


def _print_results(summary: dict, rounds: list[dict], errors: list[str], rates: list[str]) -> None:
    print(table(summary, rates))
    print()
    print(per_round(rounds))
    if errors:
        print("errors: " + "; ".join(errors))


def main(argv: Optional[list[str]] = None) -> int:
    args, overrides = _parse_args(_parser(), argv)
    consumers = [c for c in CONSUMERS if c in args.consumers]  # naive first: the Nx rates need its drain
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    require_clients()
    signal.signal(signal.SIGTERM, _sigterm)

    args.out.mkdir(parents=True, exist_ok=True)
    logs = args.out / "logs"
    logs.mkdir(exist_ok=True)
    began = time.monotonic()
    rounds: list[dict] = []
    errors: list[str] = []
    frames = _measure(args, consumers, overrides, logs, began + args.max_seconds, rounds, errors)
    summary = aggregate(rounds, args.rates)
    report = _report(args, argv, overrides, frames, began, summary, rounds, errors)
    (args.out / "bench_detect.json").write_text(json.dumps(report, indent=2))
    _print_results(summary, rounds, errors, args.rates)
    logger.info("wrote %s in %.0fs", args.out / "bench_detect.json", time.monotonic() - began)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
