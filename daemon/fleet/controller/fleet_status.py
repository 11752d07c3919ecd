"""`edge-inferd fleet status`: every node's reported document (docs/fleet.md, "Reported") as a
table, a row per node and model; `--watch` redraws it as the documents change.

The style is `edge-inferd status --watch`'s (daemon/tools/status_watch.py): a heading with the
time; on a terminal the screen is cleared before each table, into a pipe or a file each table
follows the last under a rule. Columns are as wide as their widest cell: a fleet table cut at 80
columns would lose the error and age columns an operator looks for first.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional, TextIO

from daemon.fleet.controller import reported_view
from daemon.fleet.controller.controller_link import ControllerLink

CLEAR = "\033[H\033[2J"
RULE_WIDTH = 80
_RULE = "-" * RULE_WIDTH
COLUMNS = ("node", "model", "version", "serial", "state", "gate", "canary", "error", "age")
NO_VALUE = "-"


def rows(reported: dict[str, dict], model: Optional[str], now: float) -> list[dict]:
    """One plain dict per node and model (sorted), the `--json` output and the table's source."""
    out = []
    for node, doc in sorted(reported.items()):
        models = doc.get("models") if isinstance(doc.get("models"), dict) else {}
        names = [m for m in sorted(models) if model is None or m == model]
        if not names and model is None:
            out.append(_row(node, NO_VALUE, {}, doc, now))
        out += [_row(node, name, reported_view.model_entry(doc, name) or {}, doc, now) for name in names]
    return out


def _row(node: str, model: str, entry: dict, doc: dict, now: float) -> dict:
    stamp = doc.get("time")
    return {
        "node": node, "model": model, "version": entry.get("version"), "serial": entry.get("serial"),
        "state": entry.get("state"), "download_pct": reported_view.download_pct(entry),
        "gate": entry.get("gate") if isinstance(entry.get("gate"), dict) else None,
        "canary": entry.get("canary") if isinstance(entry.get("canary"), dict) else None,
        "error": reported_view.error_code(entry),
        # `time` is the node's own clock, for display only (gateways have no reliable clock).
        "age_s": round(max(0.0, now - stamp), 1) if isinstance(stamp, (int, float)) else None,  # clocks differ a little
    }


def render(table_rows: list[dict], heading: str = "") -> str:
    cells = [COLUMNS] + [_cells(row) for row in table_rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in cells]
    if not table_rows:
        lines = ["no edge-inferd node has reported a fleet document yet"]
    return "\n".join(([heading] if heading else []) + lines)


def _cells(row: dict) -> tuple[str, ...]:
    state = row["state"] or NO_VALUE
    if row["download_pct"] is not None and state == reported_view.DOWNLOADING:
        state = f"{state} {row['download_pct']}%"
    age = NO_VALUE if row["age_s"] is None else f"{row['age_s']:.0f}s"
    return (row["node"], row["model"], _text(row["version"]), _text(row["serial"]), state,
            _gate(row["gate"]), _canary(row["canary"]), _text(row["error"]), age)


def _gate(gate: Optional[dict]) -> str:
    """`pass accuracy 0.975` (per route, the new model's metric on the node's data)."""
    if not gate or "passed" not in gate:
        return NO_VALUE
    routes = gate.get("routes") if isinstance(gate.get("routes"), dict) else {}
    metrics = [f"{r.get('metric', '?')} {_num(r.get('value'))}" for r in routes.values() if isinstance(r, dict)]
    return " ".join(["pass" if gate["passed"] else "fail", *metrics])


def _canary(canary: Optional[dict]) -> str:
    """`812/200 41/60s psi 0.012 lat x1.04`: answers so far of those it needs, seconds so far of its
    duration, drift and CPU time per sample against the previous release (`-` until judged)."""
    if not canary:
        return NO_VALUE
    answers = f"{_text(canary.get('answers'))}/{_text(canary.get('min_answers'))}"
    seconds = f"{_num(canary.get('elapsed_s'), 0)}/{_num(canary.get('duration_s'), 0)}s"
    return f"{answers} {seconds} psi {_num(canary.get('psi'))} lat x{_num(canary.get('latency_ratio'))}"


def _num(value: object, decimals: Optional[int] = None) -> str:
    """A figure in three significant digits, or with `decimals` decimals."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and decimals is not None:
        return f"{value:.{decimals}f}"
    if isinstance(value, float):
        return f"{value:.3g}"
    return _text(value)


def _text(value: object) -> str:
    return NO_VALUE if value is None else str(value)


def snapshot(link: ControllerLink, model: Optional[str], now: float) -> list[dict]:
    with link.cond:
        reported = {node: dict(doc) for node, doc in link.reported.items()}
    return rows(reported, model, now)


def watch(link: ControllerLink, model: Optional[str], interval_s: float, out: TextIO, stop: threading.Event,
          heading: str, clock: Callable[[], float] = time.time) -> None:
    """Draw the table at once, again on each change, and every `interval_s` (the ages move)."""
    clear = out.isatty()
    while not stop.is_set():
        seen = link.seq
        stamp = time.strftime("%H:%M:%S", time.localtime(clock()))
        table = render(snapshot(link, model, clock()), f"{heading}  {stamp}")
        out.write((CLEAR if clear else _RULE + "\n") + table + "\n")
        out.flush()
        link.wait(lambda: link.seq != seen or stop.is_set(), interval_s)
