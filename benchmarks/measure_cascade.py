#!/usr/bin/env python3
"""The confidence cascade on the appliance route: accuracy, escalated share and CPU per request.

    python benchmarks/measure_cascade.py [--repeat 5]

Runs models/appliance/test.npz (ACSF1's held-out split) through the daemon's own pipeline
(`daemon.pipeline.request_path.handle_batch`, one request per call as a worker sees a lone request, JSON
payloads, no cache) three ways: the fast model (`appliance`) alone, the large model
(`appliance_large`) alone, and the cascade (`escalate: {to_model: appliance_large}`,
`daemon.serve.cascade.Cascade.run_local`). CPU is `time.process_time()` over the split (all
threads, decoding and preprocessing included), divided by the number of requests.

ACSF1 has no validation split (100 train / 100 test), and training-split scores are
overconfident, so the threshold is chosen on the even-indexed half of the test split
(half A: the least escalation whose accuracy is within 1 pt of large-alone there) and
reported on the odd half (half B, unseen by the choice) and on the whole split.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from types import MappingProxyType

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from daemon.model import preprocess  # noqa: E402
from daemon.serve.cascade import Cascade  # noqa: E402
from daemon.config.schema import ModelConfig
from daemon.config.loader import load_config
from daemon.config.model_files import open_model  # noqa: E402
from daemon.config.escalate import EscalateConfig  # noqa: E402
from daemon.pipeline.evaluate import find_route, load_split
from daemon.pipeline.route_pipeline import route_pipeline  # noqa: E402
from daemon.pipeline.route_pipeline import Request
from daemon.pipeline.request_path import handle_batch  # noqa: E402

ROUTE = "appliance"
LARGE = "appliance_large"
TARGET_PT = 0.01  # the cascade may trail large-alone by this much accuracy
GRID = {"score_below": np.round(np.arange(0.05, 1.0, 0.05), 2), "margin_below": np.round(np.arange(0.05, 1.0, 0.05), 2)}


def large_steps() -> tuple:
    """The large model's own preprocessing (`escalate.preprocess`), as its card records it."""
    card = json.loads((ROOT / f"models/{LARGE}/card.json").read_text())
    return tuple(preprocess.parse_step(step) for step in card["preprocessing"])


def setup(escalate: EscalateConfig):
    escalate = dataclasses.replace(escalate, to_model=LARGE, preprocess=large_steps())
    config = load_config(ROOT / "config.yaml")
    large = ModelConfig(LARGE, ROOT / f"models/{LARGE}/model.tflite", ROOT / f"models/{LARGE}/labels.txt")
    config = dataclasses.replace(config, models=MappingProxyType({**config.models, LARGE: large}))
    route = dataclasses.replace(find_route(config, ROUTE), escalate=escalate)
    fast_model, large_model = open_model(config, route.model), open_model(config, LARGE)
    pipe = route_pipeline(config, route, fast_model)
    large_pipe = route_pipeline(config, escalate.large_route(route), large_model)
    return route, dataclasses.replace(pipe, escalate_to=large_pipe), fast_model, large_pipe, large_model


def run(pipe, model, payloads, cascade=None, large=None) -> tuple[list[dict], float]:
    """Replies and CPU seconds per request, one request per pipeline call."""
    replies = []
    started = time.process_time()
    for payload in payloads:
        outcome = handle_batch(pipe, [Request(payload, time.monotonic())], model, None, time.monotonic)
        if cascade is not None:
            outcome = cascade.run_local(pipe, pipe.escalate_to, [Request(payload, time.monotonic())], outcome,
                                        large, None)
        replies.append(outcome.replies[0])
    return replies, (time.process_time() - started) / len(payloads)


def cascade_pred(fast: list[dict], large: list[dict], key: str, t: float) -> tuple[np.ndarray, np.ndarray]:
    esc = EscalateConfig(**{key: t})
    up = np.array([esc.wants([e["score"] for e in r["top_k"]]) for r in fast])
    pred = np.where(up, [r["index"] for r in large], [r["index"] for r in fast])
    return pred, up


def choose(fast, large, y, half) -> tuple[str, float]:
    """On `half`: the (key, threshold) with the least escalation within TARGET_PT of large-alone."""
    target = np.mean(np.array([r["index"] for r in large])[half] == y[half]) - TARGET_PT
    best = None
    for key, grid in GRID.items():
        for t in grid:
            pred, up = cascade_pred(fast, large, key, float(t))
            if np.mean(pred[half] == y[half]) >= target - 1e-9 and (best is None or up[half].mean() < best[0]):
                best = (up[half].mean(), key, float(t))
    return best[1], best[2]


def sweep(fast, large, y) -> dict:
    """score_below -> escalated share and cascade accuracy on the whole split (the trade-off; not the choice)."""
    out = {}
    for t in (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9):
        pred, up = cascade_pred(fast, large, "score_below", t)
        out[str(t)] = {"escalated": round(float(up.mean()), 2), "accuracy": round(float(np.mean(pred == y)), 4)}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="passes over the split for the CPU figures")
    args = parser.parse_args()
    route, pipe, fast_model, large_pipe, large_model = setup(EscalateConfig(score_below=0.5))
    x, y = load_split(ROOT / f"models/{ROUTE}/test.npz", route)
    payloads = [json.dumps({"id": i, "data": row.tolist()}).encode() for i, row in enumerate(x)]
    fast, _ = run(pipe, fast_model, payloads)
    large, _ = run(large_pipe, large_model, payloads)
    half_a, half_b = np.arange(len(y)) % 2 == 0, np.arange(len(y)) % 2 == 1
    key, t = choose(fast, large, y, half_a)
    route, pipe, fast_model, large_pipe, large_model = setup(
        EscalateConfig(**{key: t}, max_rate_per_s=1e9))
    cpu = {"fast": [], "large": [], "cascade": []}
    for _ in range(args.repeat):
        cpu["fast"].append(run(pipe, fast_model, payloads)[1])
        cpu["large"].append(run(large_pipe, large_model, payloads)[1])
        replies, seconds = run(pipe, fast_model, payloads, Cascade(time.monotonic), large_model)
        cpu["cascade"].append(seconds)
    pred_c = np.array([r["index"] for r in replies])
    tiers = np.array([r["tier"] for r in replies])
    acc = lambda p, part: round(float(np.mean(np.asarray(p)[part] == y[part])), 4)  # noqa: E731
    everything = np.ones(len(y), bool)
    report = {"n": len(y), "threshold": {key: t, "chosen_on": "even-indexed half of test.npz (half A)"},
              "escalated_share": {"all": round(float(np.mean(tiers == "local-large")), 4),
                                  "half_b": round(float(np.mean(tiers[half_b] == "local-large")), 4)}}
    for name, pred in (("fast", [r["index"] for r in fast]), ("large", [r["index"] for r in large]),
                       ("cascade", pred_c)):
        report[name] = {"accuracy_all": acc(pred, everything), "accuracy_half_b": acc(pred, half_b),
                        "cpu_ms_per_request": round(float(np.median(cpu[name])) * 1000, 3)}
    report["sweep_score_below"] = sweep(fast, large, y)
    report["cascade_cpu_share_of_large"] = round(report["cascade"]["cpu_ms_per_request"]
                                                 / report["large"]["cpu_ms_per_request"], 3)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
