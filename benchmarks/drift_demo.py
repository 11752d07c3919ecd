#!/usr/bin/env python3
"""Drift on real data: a bundled test set replayed clean, then with a sensor fault, through the daemon's
own request path and drift monitor (no broker), reporting accuracy and PSI per step.

    python benchmarks/drift_demo.py                     # table on stdout, docs/drift.png
    python benchmarks/drift_demo.py --plot ''           # no plot

Route `activity` (models/activity/test.npz, 40 IMU windows, the bundled INT8 model): each step
replays the set `--replays` times with a little sensor noise (`--noise` of each channel's std, so
no two replays are the same), then adds a bias to the accelerometer's x axis (a sensor offset, in
m/s^2) that grows step by step, and last goes back to clean. Route `load` (an autoencoder,
models/load_anomaly/test.npz): the same, with meter noise growing instead (its per-day z-score
cancels any offset or gain). The reference of both is their `validate` data, as in the daemon
(daemon/lifecycle/drift_reference.py); the window holds one step's answers.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time
import timeit
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from daemon.config.drift import DriftConfig  # noqa: E402
from daemon.config.loader import load_config  # noqa: E402
from daemon.config.model_files import open_model  # noqa: E402
from daemon.lifecycle import drift_reference  # noqa: E402
from daemon.obs.drift import DriftMonitor  # noqa: E402
from daemon.pipeline import evaluate, request_path, scoring  # noqa: E402
from daemon.pipeline.route_pipeline import Request, route_pipeline  # noqa: E402
from daemon.serve.replies import drift_answer  # noqa: E402

BATCH = 32
ACC_X = 0  # the activity windows' channels: acc x, y, z, gyro x, y, z
OFFSETS_MS2 = (0.0, 1.0, 2.0, 4.0, 8.0, 0.0)  # accelerometer x bias per step (the last: fixed again)
LOAD_NOISE = (0.0, 0.1, 0.2, 0.4, 0.8, 0.0)  # meter noise per step, in units of each day's std
SEED = 18


def _stream(pipe, model, monitor: DriftMonitor, x: np.ndarray) -> list[dict]:
    """Every sample as a JSON request through request_path.handle_batch, its reply fed to drift as
    the reply path does (daemon/serve/replies.py): one `observe` per batch."""
    replies = []
    for start in range(0, len(x), BATCH):
        requests = [Request(json.dumps({"id": start + i, "data": row.tolist()}).encode(), time.monotonic())
                    for i, row in enumerate(x[start:start + BATCH])]
        outcome = request_path.handle_batch(pipe, requests, model, None, time.monotonic)
        answers: list = []
        for reply in outcome.replies:
            drift_answer(reply, answers)
        monitor.observe(answers)
        replies += outcome.replies
    return replies


def _route(config, name: str, replays: int):
    route = evaluate.find_route(config, name)
    model = open_model(config, route.model)
    pipe = route_pipeline(config, route, model)
    x, y = evaluate.load_split(route.validate_data, route)
    drift = DriftConfig(window=replays * len(x), min_answers=min(200, replays * len(x)))
    monitor = DriftMonitor(drift)
    drift_reference.configure(monitor, dataclasses.replace(config, drift=drift), [pipe], {route.model: model})
    return route, model, pipe, x, y, monitor


def run_activity(config, replays: int, noise: float, rng: np.random.Generator) -> list[dict]:
    route, model, pipe, x, y, monitor = _route(config, "activity", replays)
    std = x.std(axis=(0, 1))  # each channel's spread over the test set
    rows = []
    for step, offset in enumerate(OFFSETS_MS2):
        xs = np.concatenate([x + rng.normal(0.0, noise, x.shape).astype(np.float32) * std for _ in range(replays)])
        xs[..., ACC_X] += offset
        replies = _stream(pipe, model, monitor, np.round(xs, 3))
        state = monitor.snapshot()[route.name]
        truth = np.tile(y, replays)
        accuracy = float(np.mean([r["index"] for r in replies] == truth))
        rows.append({"route": "activity", "step": step, "shift": f"acc x {offset:+g} m/s²", "accuracy": accuracy,
                     "psi_labels": state["psi"]["labels"], "psi_score": state["psi"]["score"],
                     "mean_score": float(np.mean([r["score"] for r in replies])), "drifting": state["drifting"]})
    return rows


def run_load(config, replays: int, rng: np.random.Generator) -> list[dict]:
    route, model, pipe, x, y, monitor = _route(config, "load", 1)
    rows = []
    for step, level in enumerate(LOAD_NOISE):
        day_std = x.std(axis=1, keepdims=True)
        xs = (x + rng.normal(0.0, 1.0, x.shape) * day_std * level).astype(np.float32)
        replies = _stream(pipe, model, monitor, np.round(xs, 3))
        state = monitor.snapshot()[route.name]
        scores = np.array([r["anomaly_score"] for r in replies])
        rows.append({"route": "load", "step": step, "shift": f"meter noise {level:g} σ",
                     "roc_auc": float(scoring.roc_auc(y, scores)),
                     "flagged": float(np.mean(scores > route.threshold)), "psi_score": state["psi"]["score"],
                     "p90": state["score_quantiles"]["p90"], "reference_p90": state["reference_quantiles"]["p90"],
                     "drifting": state["drifting"]})
    return rows


def cost_per_answer_us(config) -> float:
    """timeit of what drift adds per answer on the reply path (the tally's append and the window's update)."""
    _, _, _, _, _, monitor = _route(config, "activity", 25)
    replies = [{"route": "activity", "index": i % 4, "score": 0.99} for i in range(BATCH)]

    def batch() -> None:
        answers: list = []
        for reply in replies:
            drift_answer(reply, answers)
        monitor.observe(answers)

    batch()
    return min(timeit.repeat(batch, number=2000, repeat=7)) / (2000 * BATCH) * 1e6


def plot(activity: list[dict], load: list[dict], path: Path, warn: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    steps = [r["step"] for r in activity]
    left.plot(steps, [r["psi_labels"] for r in activity], "o-", label="PSI, top-1 labels")
    left.plot(steps, [r["psi_score"] for r in activity], "s-", label="PSI, top score")
    left.axhline(warn, color="red", ls="--", lw=1, label=f"drift.warn_above {warn:g}")
    left.set_yscale("symlog", linthresh=0.1)
    left.set_xticks(steps, [r["shift"].replace("acc x ", "") for r in activity], fontsize=8)
    left.set_xlabel("accelerometer x offset per step (the last: fixed again)")
    left.set_ylabel("PSI (symlog)")
    twin = left.twinx()
    twin.bar(steps, [r["accuracy"] for r in activity], alpha=0.15, color="green", label="accuracy")
    twin.set_ylim(0, 1.05)
    twin.set_ylabel("accuracy")
    left.set_ylim(0, None)
    left.set_zorder(twin.get_zorder() + 1)  # the lines over the bars
    left.patch.set_visible(False)
    left.set_title("activity (classify): bars = accuracy")
    left.legend(loc="upper left", fontsize=8)
    steps = [r["step"] for r in load]
    right.plot(steps, [r["psi_score"] for r in load], "s-", color="tab:orange", label="PSI, anomaly score")
    right.axhline(warn, color="red", ls="--", lw=1)
    right.set_yscale("symlog", linthresh=0.1)
    right.set_xticks(steps, [r["shift"].replace("meter noise ", "") for r in load], fontsize=8)
    right.set_xlabel("meter noise per step, in each day's σ")
    twin = right.twinx()
    twin.bar(steps, [r["flagged"] for r in load], alpha=0.15, color="purple")
    twin.set_ylim(0, 1.05)
    twin.set_ylabel("share flagged anomalous")
    right.set_ylim(0, None)
    right.set_zorder(twin.get_zorder() + 1)
    right.patch.set_visible(False)
    right.set_title("load (anomaly): bars = share flagged")
    right.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "config.yaml"))
    parser.add_argument("--replays", type=int, default=10, help="replays of the test set per step")
    parser.add_argument("--noise", type=float, default=0.05, help="sensor noise, in each channel's std")
    parser.add_argument("--plot", default=str(ROOT / "docs" / "drift.png"), help="'' for none")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="  log: %(levelname)s %(message)s")
    logging.getLogger("daemon.lifecycle.drift_reference").setLevel(logging.WARNING)
    config = load_config(args.config)
    rng = np.random.default_rng(SEED)
    activity = run_activity(config, args.replays, args.noise, rng)
    load = run_load(config, args.replays, rng)
    print("| route | step | shift | accuracy | PSI labels | PSI score | mean top score |")
    print("|---|---|---|---|---|---|---|")
    for r in activity:
        print(f"| activity | {r['step']} | {r['shift']} | {r['accuracy']:.3f} | {r['psi_labels']:.3f} | "
              f"{r['psi_score']:.3f} | {r['mean_score']:.3f} |")
    print()
    print("| route | step | shift | ROC-AUC | flagged | PSI score | p90 (reference) |")
    print("|---|---|---|---|---|---|---|")
    for r in load:
        print(f"| load | {r['step']} | {r['shift']} | {r['roc_auc']:.3f} | {r['flagged']:.3f} | {r['psi_score']:.3f} | "
              f"{r['p90']:.4f} ({r['reference_p90']:.4f}) |")
    print(f"\ndrift's cost per answer on the reply path: {cost_per_answer_us(config):.2f} µs (batches of {BATCH})")
    if args.plot:
        plot(activity, load, Path(args.plot), config.drift.warn_above)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
