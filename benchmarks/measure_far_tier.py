#!/usr/bin/env python3
"""The cascade's far tier: `to_v2` (MLServer, KServe) against `to_topic` (docs/http.md, "Figures:
the far tier against to_topic"):

    PYTHONPATH=$PWD .venv/bin/python benchmarks/measure_far_tier.py [--rounds 2] [--rate 8] [--json out.json]

Needs mosquitto (and mosquitto-clients) and the v2 venvs (./scripts/setup_v2.sh); a mode whose
server cannot run is skipped and said so. One private mosquitto, one far edge-inferd serving
appliance_large (models/appliance_large/config.yaml, MQTT v5) and one MLServer 1.7.1 and one
KServe 0.21.0 serving it (tests/integration/v2_servers.py) are started once per run. Per round,
each mode in turn gets a fresh near daemon (MQTT v5, session_expiry_s 0: nothing of a round
outlives it) running config.yaml's appliance route with the cascade `when: {score_below: 0.65}`,
escalate.preprocess from appliance_large's card, max_rate_per_s 1000 (never limits) and, as its
far tier: to_topic (the far daemon), to_v2 to MLServer (JSON), to KServe (JSON) and to KServe
(`binary: true`); as references to_model appliance_large on the near node, and no escalation.

The workload: after 10 warm-up requests, all 100 traces of models/appliance/test.npz as distinct
JSON requests (cache off), an open-loop stream at --rate per second (appliance_large costs ~80 ms
a row on 2 shared cores: the far tier must keep up). Counted: results, not replies; every request
must be answered exactly once (missing and duplicates reported). timeout_ms is generous (2000 by
default) so that the figures are about the tiers, not the deadline. Latency is the client's, from
the publish to the reply on the result topic (mosquitto_pub/mosquitto_sub), for the requests the
cascade escalated (whatever came of it) and for the others, pooled over the rounds. far_ms: the
far daemon's own latency_ms in its answers (to_topic only: arrival there to its answer) and
appliance_large in-process, one row, one thread (the servers' runtime does the same per call).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from daemon.model import preprocess  # noqa: E402
from daemon.model.runtime import Model  # noqa: E402
from daemon.tools.bench.load import Collector, LinePublisher, json_line, percentiles, require_clients  # noqa: E402
from daemon.tools.bench.phases import start_daemon  # noqa: E402
from daemon.tools.broker import Broker  # noqa: E402
from tests.integration import v2_servers  # noqa: E402

THRESHOLD = 0.65
LARGE = "appliance_large"
NEAR, FAR = "near", "far"
REQUESTS, RESULTS = "plugs/p1/power", "results/+/appliance"
FAR_TOPIC = "gpu/{1}/appliance"  # the far daemon's route subscribes gpu/+/appliance
MODES = ("to_topic", "to_v2 mlserver", "to_v2 kserve", "to_v2 kserve binary", "to_model", "local only")
SERVER_OF = {"to_v2 mlserver": v2_servers.MLSERVER, "to_v2 kserve": v2_servers.KSERVE,
             "to_v2 kserve binary": v2_servers.KSERVE}
WARM = 10
BLOCK = 1000  # request ids: one block per (round, mode)
DRAIN_S = 30.0  # after the last request: how long the stream's answers may take at most
ESCALATED = ("remote", "local-large")
MODEL_ROWS = 20


class Replies(Collector):
    """Every reply by request id, duplicates kept: id -> [(perf_counter at arrival, reply)]."""

    def __init__(self, address: str, topic_filter: str):
        self.all: dict[int, list[tuple[float, dict]]] = {}
        super().__init__(address, topic_filter)

    def _arrived(self, at: float, obj) -> None:
        if isinstance(obj, dict) and isinstance(obj.get("id"), int):
            self.all.setdefault(obj["id"], []).append((at, obj))


def near_route(mode: str, servers: dict, timeout_ms: float) -> dict:
    """config.yaml's appliance route with the mode's cascade."""
    raw = yaml.safe_load((ROOT / "config.yaml").read_text())
    route = next(r for r in raw["routes"] if r["name"] == "appliance")
    route.pop("validate", None)
    if mode == "local only":
        return route
    steps = json.loads((ROOT / f"models/{LARGE}/card.json").read_text())["preprocessing"]
    esc = {"when": {"score_below": THRESHOLD}, "max_rate_per_s": 1000}
    if mode == "to_model":
        esc.update(to_model=LARGE, preprocess=steps)
    elif mode == "to_topic":
        esc.update(to_topic=FAR_TOPIC, timeout_ms=timeout_ms)
    else:
        server = servers[SERVER_OF[mode]]
        esc.update(preprocess=steps, timeout_ms=timeout_ms,
                   to_v2={"url": server.url, "model": server.model, "output": "scores",
                          "binary": mode.endswith("binary")})
    route["escalate"] = esc
    return route


def near_overrides(mode: str, servers: dict, timeout_ms: float) -> dict:
    models = {name: {"path": str(ROOT / f"models/{name}/model.tflite"),
                     "labels": str(ROOT / f"models/{name}/labels.txt")} for name in ("appliance", LARGE)}
    return {"mqtt": {"protocol": 5}, "models": models, "cache": {"enabled": False},
            "routes": [near_route(mode, servers, timeout_ms)]}


def stream(pub: LinePublisher, lines: list[bytes], first_id: int, rate: float) -> dict[int, float]:
    """Paced distinct requests (open loop); id -> perf_counter at publish."""
    sent, start = {}, time.perf_counter()
    for k, data in enumerate(lines):
        delay = start + k / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        sent[first_id + k] = time.perf_counter()
        pub.send(json_line(first_id + k, data))
    return sent


def wait_answers(replies: Replies, ids, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(i in replies.all for i in ids) and time.monotonic() < deadline:
        time.sleep(0.05)


def run_mode(mode: str, block: int, ctx: dict) -> dict:
    """One near daemon for `mode`: the warm-up, the stream, every answer (or the drain's end)."""
    args, lines = ctx["args"], ctx["lines"]
    workdir = ctx["workdir"] / f"{block}"
    workdir.mkdir()
    near = start_daemon(ROOT / "config.yaml", workdir, NEAR, near_overrides(mode, ctx["servers"], args.timeout_ms),
                        ctx["address"], workdir / "near.log", pythonpath=ROOT)
    try:
        warm = stream(ctx["pub"], lines[::len(lines) // WARM], block + BLOCK // 2, args.rate)
        wait_answers(ctx["replies"], warm, DRAIN_S)
        sent = stream(ctx["pub"], lines, block, args.rate)
        wait_answers(ctx["replies"], sent, DRAIN_S + args.timeout_ms / 1000)
        time.sleep(args.timeout_ms / 1000 + 0.5)  # room for a duplicate to show up
    finally:
        near.stop()
    return summarise(mode, sent, ctx)


def summarise(mode: str, sent: dict[int, float], ctx: dict) -> dict:
    """Per request (by id): the first reply's figures; missing and duplicates counted."""
    y, got = ctx["y"], ctx["replies"].all
    ids = sorted(sent)
    rtt = {"escalated": [], "others": []}
    tiers, outcomes, correct, errors, far_ms = {}, {}, 0, 0, []
    for k, i in enumerate(ids):
        if i not in got:
            continue
        at, reply = got[i][0]
        if "error" in reply:
            errors += 1
            continue
        tier, outcome = reply.get("tier", "none"), reply.get("escalation")
        tiers[tier] = tiers.get(tier, 0) + 1
        if outcome:
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
        escalated = tier in ESCALATED or outcome in ("error", "timeout")
        rtt["escalated" if escalated else "others"].append((at - sent[i]) * 1000.0)
        correct += int(reply["index"] == y[k])
        if i in ctx["far"].all:
            far_ms.append(ctx["far"].all[i][0][1]["latency_ms"])
    return {"mode": mode, "n": len(ids), "missing": sum(i not in got for i in ids),
            "duplicates": sum(len(got[i]) - 1 for i in ids if i in got), "errors": errors,
            "accuracy": round(correct / len(ids), 4), "tiers": tiers, "escalation": outcomes,
            "rtt_ms": rtt, "far_ms": far_ms}


def merge(rows: list[dict]) -> dict:
    """One mode's rounds: counts summed, accuracies listed, latencies pooled."""
    n = sum(r["n"] for r in rows)
    out = {"mode": rows[0]["mode"], "rounds": len(rows), "n": n,
           "accuracy": [r["accuracy"] for r in rows]}
    for key in ("missing", "duplicates", "errors"):
        out[key] = sum(r[key] for r in rows)
    for key in ("tiers", "escalation"):
        out[key] = {name: sum(r[key].get(name, 0) for r in rows) for name in sorted({k for r in rows for k in r[key]})}
    esc = sum(len(r["rtt_ms"]["escalated"]) for r in rows)
    out["escalated_share"] = round(esc / n, 4)
    out["answered_far_share"] = round(sum(out["tiers"].get(t, 0) for t in ESCALATED) / n, 4)
    for kind in ("escalated", "others"):
        out[f"rtt_{kind}_ms"] = percentiles([v for r in rows for v in r["rtt_ms"][kind]])
    out["far_daemon_ms"] = percentiles([v for r in rows for v in r["far_ms"]])
    out["per_round"] = [{"accuracy": r["accuracy"], **{f"rtt_{kind}_ms": percentiles(r["rtt_ms"][kind])
                                                       for kind in ("escalated", "others")}} for r in rows]
    return out


def model_ms(rows: np.ndarray) -> float:
    """appliance_large in-process, one row per call, one thread: the median ms."""
    model, times = Model(ROOT / f"models/{LARGE}/model.tflite"), []
    for row in rows[:MODEL_ROWS]:
        started = time.perf_counter()
        model.infer(row[None])
        times.append((time.perf_counter() - started) * 1000.0)
    return round(float(np.median(times[1:])), 2)


def _ms(p: dict, key: str) -> str:
    return "-" if p[key] is None else f"{p[key]:.0f}"


def table(merged: list[dict], skipped: dict) -> str:
    head = ("| far tier | accuracy | escalated | answered far | error/timeout/rate_limited | "
            "escalated p50 / p99 ms | others p50 / p99 ms | missing/dup |")
    lines = [head, "|" + "---|" * 8]
    for m in merged:
        acc = "/".join(f"{a:.2f}" for a in sorted(set(m["accuracy"])))
        outcomes = "/".join(str(m["escalation"].get(k, 0)) for k in ("error", "timeout", "rate_limited"))
        e, o = m["rtt_escalated_ms"], m["rtt_others_ms"]
        lines.append(f"| {m['mode']} | {acc} | {m['escalated_share']:.0%} | {m['answered_far_share']:.0%} | "
                     f"{outcomes} | {_ms(e, 'p50')} / {_ms(e, 'p99')} | {_ms(o, 'p50')} / {_ms(o, 'p99')} | "
                     f"{m['missing']}/{m['duplicates']} |")
    lines += [f"| {mode} | skipped: {why} |" for mode, why in skipped.items()]
    return "\n".join(lines)


def start_servers(workdir: Path, modes: list[str]) -> tuple[dict, dict]:
    """The v2 servers the modes need (once per run); the modes that cannot run, with why."""
    servers, why = {}, {}
    for kind in sorted({SERVER_OF[m] for m in modes if m in SERVER_OF}):
        why[kind] = v2_servers.available(kind)
        if why[kind] is None:
            servers[kind] = v2_servers.V2Server(kind, workdir / kind).start()
    return servers, {m: why[SERVER_OF[m]] for m in modes if m in SERVER_OF and why[SERVER_OF[m]]}


def measure(args: argparse.Namespace, workdir: Path) -> dict:
    with np.load(ROOT / "models/appliance/test.npz") as data:
        x, y = data["x"].astype(np.float32), data["y"]
    card = json.loads((ROOT / f"models/{LARGE}/card.json").read_text())
    large_rows = preprocess.apply_steps(tuple(preprocess.parse_step(s) for s in card["preprocessing"]), x)
    load_before = os.getloadavg()
    ctx = {"args": args, "workdir": workdir, "y": y, "lines": [json.dumps(row.tolist()).encode() for row in x]}
    with Broker(workdir / "broker") as broker:
        ctx["address"] = broker.address
        servers, skipped = start_servers(workdir, args.modes)
        far = start_daemon(ROOT / f"models/{LARGE}/config.yaml", _mkdir(workdir / "far"), FAR, {}, broker.address,
                           workdir / "far" / "far.log", pythonpath=ROOT)
        ctx.update(servers=servers, replies=Replies(broker.address, RESULTS),
                   far=Replies(broker.address, f"edge-inferd/{NEAR}/escalations"),
                   pub=LinePublisher(broker.address, REQUESTS))
        rows: dict[str, list[dict]] = {m: [] for m in args.modes if m not in skipped}
        try:
            for r in range(args.rounds):
                for j, mode in enumerate(rows):
                    rows[mode].append(run_mode(mode, (r * len(MODES) + j + 1) * BLOCK, ctx))
        finally:
            for part in (ctx["pub"], ctx["replies"], ctx["far"]):
                part.close()
            far.stop()
            for server in servers.values():
                server.kill(signal.SIGTERM)
    merged = [merge(rounds) for rounds in rows.values()]
    return {"rounds": args.rounds, "rate_per_s": args.rate, "timeout_ms": args.timeout_ms, "n": len(y),
            "threshold": {"score_below": THRESHOLD}, "far_model_in_process_ms": model_ms(large_rows),
            "loadavg_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
            "modes": merged, "skipped": skipped, "table": table(merged, skipped)}


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds over the modes")
    parser.add_argument("--rate", type=float, default=8.0, help="requests per second (the far tier must keep up)")
    parser.add_argument("--timeout-ms", type=float, default=2000.0, help="escalate.timeout_ms of the far tiers")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--modes", default=",".join(MODES), help=f"a comma-separated subset of {', '.join(MODES)}")
    args = parser.parse_args()
    args.modes = [m for m in MODES if m in args.modes.split(",")]
    require_clients()
    with tempfile.TemporaryDirectory(prefix="edge-inferd-far-tier-") as tmp:
        report = measure(args, Path(tmp))
    print(report["table"])
    far = [m["far_daemon_ms"] for m in report["modes"] if m["mode"] == "to_topic"]
    print(f"appliance_large in-process, one row: {report['far_model_in_process_ms']} ms; "
          f"the far daemon's own latency_ms (to_topic): {far[0] if far else '-'}; "
          f"load average before, after: {report['loadavg_before_after']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
