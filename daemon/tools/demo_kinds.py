"""The demo's printout per output kind: one line per reply and one summary line per route.

classify: the label against the expected one, and the accuracy. anomaly: the anomaly_score and
flag against normal/anomalous, and the ROC-AUC with the share flagged of each. values: the
first values, and whether every reply has each output at its length. detect: the objects
found, and whether the expected one is the top detection. Every summary line also says
answered/sent, the daemon's own p50 latency and the client's p50/p99 round trip.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from daemon.config.schema import ANOMALY, CLASSIFY, DETECT, VALUES, RouteConfig
from daemon.pipeline.scoring import roc_auc

# anomaly: the y of test.npz.
NORMAL, ANOMALOUS = "normal", "anomalous"
# Samples sent at most: anomaly (half normal, half anomalous: the ROC-AUC needs both), values.
ANOMALY_SAMPLES = 200
VALUES_SAMPLES = 5
# values: how many of each reply's first output are printed.
SHOWN_VALUES = 4


@dataclass
class RouteRun:
    """One route's replay: the samples sent (`x`; detect: JPEG bytes), what each should get (`y`:
    a label index, 0 normal / 1 anomalous, or the object a frame shows), and what came back."""

    route: RouteConfig
    x: np.ndarray
    y: np.ndarray
    labels: list[str]
    sent_at: dict[int, float] = field(default_factory=dict)
    answers: dict[int, dict] = field(default_factory=dict)
    rtt_ms: dict[int, float] = field(default_factory=dict)
    samples: list[str] = field(default_factory=list)
    """detect: what each frame is ("astronaut 640x480")."""
    value_sizes: dict[str, int] = field(default_factory=dict)
    """values: the model's outputs, each with the values it holds per sample."""


def sample_indices(kind: str, y: np.ndarray, limit: int = 0) -> np.ndarray:
    """The rows of a route's test.npz the demo sends: every one (or the first `limit`) for
    classify, ANOMALY_SAMPLES balanced ones for anomaly, the first VALUES_SAMPLES for values."""
    n = min(limit, len(y)) if limit else len(y)
    if kind == ANOMALY:
        return balanced(y, min(n, ANOMALY_SAMPLES))
    return np.arange(min(n, VALUES_SAMPLES) if kind == VALUES else n)


def balanced(y: np.ndarray, n: int) -> np.ndarray:
    """`n` rows in file order, half anomalous (y != 0) and half normal, as far as each class has them."""
    normal, anomalous = np.flatnonzero(y == 0), np.flatnonzero(y != 0)
    k = min(n // 2, anomalous.size)
    k = max(k, n - normal.size)  # too few normals: more anomalous rows
    return np.sort(np.concatenate([normal[:n - k], anomalous[:k]]))


def _mark(ok: bool) -> str:
    return "ok   " if ok else "wrong"  # not "miss": it sits next to cached=


def _classify_line(run: RouteRun, index: int, reply: dict) -> str:
    expected = run.labels[int(run.y[index])]
    mark = _mark(reply["label"] == expected)
    return f"{mark} {reply['label']:<13} score {reply['score']:.3f}  expected {expected:<13}"


def _anomaly_line(run: RouteRun, index: int, reply: dict) -> str:
    expected = ANOMALOUS if int(run.y[index]) else NORMAL
    flag = reply.get("anomaly")
    mark = "     " if flag is None else _mark(flag == (expected == ANOMALOUS))
    shown = "-" if flag is None else str(flag).lower()
    return f"{mark} anomaly_score {reply['anomaly_score']:.4f}  anomaly={shown:<5}  expected {expected:<9}"


def _values_line(run: RouteRun, index: int, reply: dict) -> str:
    name, values = next(iter(reply["values"].items()))
    flat = np.ravel(values)
    first = " ".join(f"{v:.3f}" for v in flat[:SHOWN_VALUES]) + (" ..." if flat.size > SHOWN_VALUES else "")
    more = f" (+{len(reply['values']) - 1} outputs)" if len(reply["values"]) > 1 else ""
    return f"{name} [{flat.size}]: {first}{more}"


def _box(box: dict) -> str:
    return f"({box['x_min']:.0f},{box['y_min']:.0f})-({box['x_max']:.0f},{box['y_max']:.0f})"


def _detect_line(run: RouteRun, index: int, reply: dict) -> str:
    found = reply["detections"]
    expected = str(run.y[index])
    seen = "; ".join(f"{d['label']} {d['score']:.2f} {_box(d['box'])}" for d in found) or "nothing"
    return f"{_mark(top_found(run, index))} {run.samples[index]:<20} expected {expected:<7} found {seen}"


_LINES: dict[str, Callable[[RouteRun, int, dict], str]] = {
    CLASSIFY: _classify_line, ANOMALY: _anomaly_line, VALUES: _values_line, DETECT: _detect_line}


def answer_line(run: RouteRun, index: int) -> str:
    """One reply: what the route's kind returned against what was expected, the daemon's latency, cached."""
    reply = run.answers[index]
    head = f"{run.route.name:<13} #{index:<3}"
    if "error" in reply:
        return f"{head} ERROR {reply['error']['code']}: {reply['error']['message']}"
    return (f"{head} {_LINES[run.route.kind](run, index, reply)} daemon {reply['latency_ms']:6.2f} ms  "
            f"cached={str(reply['cached']).lower()}")


def top_found(run: RouteRun, index: int) -> bool:
    """detect: the expected object is the reply's top detection."""
    found = run.answers[index].get("detections") or []
    return bool(found) and found[0]["label"] == str(run.y[index])


def _accuracy(run: RouteRun) -> str:
    correct = sum(1 for i, r in run.answers.items() if r.get("label") == run.labels[int(run.y[i])])
    return f"accuracy {correct / max(len(run.sent_at), 1):.3f}"


def _share(flags: list[bool]) -> str:
    return f"{np.mean(flags):.0%}" if flags else "-"


def _anomaly_summary(run: RouteRun) -> str:
    scored = {i: r for i, r in run.answers.items() if "anomaly_score" in r}
    y = np.array([int(run.y[i]) for i in scored], dtype=int)
    scores = np.array([r["anomaly_score"] for r in scored.values()], dtype=float)
    auc = f"{roc_auc(y, scores):.3f}" if 0 < y.sum() < y.size else "n/a"  # it needs both classes
    flags = {i: r["anomaly"] for i, r in scored.items() if "anomaly" in r}
    if not flags:
        return f"ROC-AUC {auc}  flagged: no threshold set"
    normal = [f for i, f in flags.items() if not int(run.y[i])]
    anomalous = [f for i, f in flags.items() if int(run.y[i])]
    return f"ROC-AUC {auc}  flagged {_share(normal)} of {NORMAL}, {_share(anomalous)} of {ANOMALOUS} days"


def values_ok(run: RouteRun, reply: dict) -> bool:
    """values: the reply has every output of the model, each with as many values as the output holds."""
    got = reply.get("values")
    return isinstance(got, dict) and {k: int(np.size(v)) for k, v in got.items()} == run.value_sizes


def _values_summary(run: RouteRun) -> str:
    good = sum(1 for r in run.answers.values() if values_ok(run, r))
    sizes = ", ".join(f"{name} [{n}]" for name, n in run.value_sizes.items())
    return f"values of the right length in {good}/{len(run.sent_at)} replies ({sizes})"


def _detect_summary(run: RouteRun) -> str:
    found = sum(1 for i in run.answers if top_found(run, i))
    return f"found {found}/{len(run.sent_at)} (the expected object is the top detection)"


_SUMMARIES: dict[str, Callable[[RouteRun], str]] = {
    CLASSIFY: _accuracy, ANOMALY: _anomaly_summary, VALUES: _values_summary, DETECT: _detect_summary}


def summary_line(run: RouteRun) -> str:
    """A route's line: the kind's measure, answered/sent, the daemon's own p50, the client's round trip."""
    sent, got = len(run.sent_at), len(run.answers)
    errors = sum(1 for r in run.answers.values() if "error" in r)
    rtt = np.array(list(run.rtt_ms.values()) or [0.0])
    own = np.array([r["latency_ms"] for r in run.answers.values() if "latency_ms" in r] or [0.0])
    return (f"  {run.route.name:<13} {_SUMMARIES[run.route.kind](run)}  answered {got}/{sent} "
            f"({errors} errors)  daemon p50 {np.percentile(own, 50):.1f} ms  "
            f"round trip p50 {np.percentile(rtt, 50):.1f} ms  p99 {np.percentile(rtt, 99):.1f} ms")
