"""The gate: a new release measured on this node's own `validate` data, against the running one.

The measuring runs in a child process (`python -m daemon.fleet.node.gate_check`), as the reload's
check does (daemon/lifecycle/reload.py): a release's model that crashes the TFLite runtime
natively must not take the serving daemon with it. The child runs each route of the model
that has `validate.data` twice, through the route's whole pipeline: once with the running
release's files and once with the new one's, and prints one JSON object.

The verdict (here, in the parent): per route, the new release's metric may be worse than the
running one's by at most `fleet.gate.max_drop_vs_current` (accuracy and ROC-AUC lower, MAE
higher); and where the release claims a value on a validate file whose sha256 is this
node's, the node's own measure must match it within `fleet.gate.claim_tolerance`. A claim
that does not match is a preprocessing or labels mismatch between the place that trained
it and this node: the release would be wrong here however good it is there.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Optional, Sequence

from daemon.config.fleet import GateConfig
from daemon.fleet.release.refusal import CLAIM, GATE, LOAD, Refused

# Metrics by direction: a drop is `current - new` for these, `new - current` for MAE.
HIGHER_IS_BETTER = ("accuracy", "roc_auc")
LOWER_IS_BETTER = ("mae",)
# The child's output lines quoted when it fails.
TAIL_LINES = 6
# The gate's child runs this much below the daemon (nice(2) increments: 10 is a background job's).
CHILD_NICENESS = 10
_EPS = 1e-9


def measure(config_path: Path, model: str, release_dir: Path, timeout_s: float) -> tuple[dict, float]:
    """The child's report ({route: {metric, value, current, data_sha256}}) and its CPU seconds.
    Refused(LOAD) when the child fails or runs past `timeout_s`."""
    command = [sys.executable, "-m", "daemon.fleet.node.gate_check", str(config_path), model, str(release_dir)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False,
                              preexec_fn=_lower_priority)
    except subprocess.TimeoutExpired:
        raise Refused(LOAD, f"the gate's check did not finish within {timeout_s:g} s") from None
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()][-TAIL_LINES:]
        cause = f"exit {done.returncode}" if done.returncode >= 0 else f"killed by signal {-done.returncode}"
        raise Refused(LOAD, f"the release's model failed in the gate's child process ({cause}): " + " | ".join(lines))
    try:
        report = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise Refused(LOAD, f"the gate's child printed no report: {done.stdout[-200:]!r}") from None
    return report, cpu_s


def _lower_priority() -> None:
    """In the child, before it runs: below the serving daemon's priority, so measuring a release on
    a small gateway takes the cores the requests leave (bench_fleet.py: serving p99 during a swap)."""
    os.nice(CHILD_NICENESS)


def judge(report: Mapping[str, dict], claims: Sequence[Mapping], gate: GateConfig) -> dict:
    """The gate's figures for the reported doc; Refused(GATE) or Refused(CLAIM) when it fails."""
    by_sha = {c.get("validate_sha256"): c for c in claims if isinstance(c, Mapping)}
    shown = {}
    for route, figures in sorted(report.items()):
        metric, new, current = figures["metric"], figures["value"], figures.get("current")
        if current is not None:
            drop = (current - new) if metric in HIGHER_IS_BETTER else (new - current)
            if drop > gate.max_drop_vs_current + _EPS:
                words = "below" if metric in HIGHER_IS_BETTER else "above"
                raise Refused(GATE, f"route {route!r}: {metric} {new:.4f} on {figures['data']} is {words} the "
                              f"running release's {current:.4f} by {abs(drop):.4f} (fleet.gate.max_drop_vs_current "
                              f"{gate.max_drop_vs_current:g})")
        claim = by_sha.get(figures.get("data_sha256"))
        if claim is not None and claim.get("metric") == metric:
            claimed = float(claim["value"])
            if abs(claimed - new) > gate.claim_tolerance + _EPS:
                raise Refused(CLAIM, f"route {route!r}: the release claims {metric} {claimed:.4f} on this node's "
                              f"{figures['data']}, this node measures {new:.4f} (fleet.gate.claim_tolerance "
                              f"{gate.claim_tolerance:g}): a preprocessing or labels mismatch")
            figures = {**figures, "claimed": claimed}
        shown[route] = _shown(figures)
    return {"passed": True, "routes": shown}


def _shown(figures: Mapping) -> dict:
    return {k: v for k, v in figures.items() if k in ("metric", "value", "current", "claimed")}


def gated_routes(report: Mapping[str, dict]) -> Optional[str]:
    """A note for the reported doc when no route of the model has validate data (nothing gated)."""
    return None if report else "no route of this model has validate.data: the release was not measured"
