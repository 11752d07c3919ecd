"""`edge-inferd status --watch`: the node table, redrawn in the terminal as the stats come.

One connection stays subscribed to the nodes' retained status and stats topics (each daemon
publishes its stats every `stats_interval_s`, 10 s by default); every `interval_s` the table is
drawn again from the latest of each. A node's block fits a plain 80-column terminal: what
would run past it is cut with "…". On a terminal the screen is cleared first; into a pipe or
a file each table follows the last under a rule, so a log of it reads in order.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, TextIO

from daemon.tools.status import NodeFeed

WIDTH = 80
CLEAR = "\033[H\033[2J"
_RULE = "-" * WIDTH


def watch(feed: NodeFeed, interval_s: float, out: TextIO, stop: threading.Event,
          heading: str = "", clock: Callable[[], float] = time.time) -> None:
    """Draw the table every `interval_s` until `stop` is set."""
    clear = out.isatty()
    while True:
        table = render(feed.nodes(), clock(), heading)
        out.write((CLEAR if clear else _RULE + "\n") + table + "\n")
        out.flush()
        if stop.wait(interval_s):
            return


def render(nodes: dict[str, dict], now: float, heading: str = "") -> str:
    """The whole table: a heading line, then one block per node (or a line saying none yet)."""
    top = _fit(f"{heading}  {time.strftime('%H:%M:%S', time.localtime(now))}".strip())
    if not nodes:
        return top + "\n" + "no edge-inferd node has published yet"
    return top + "\n" + "\n".join(block(name, node, now) for name, node in sorted(nodes.items()))


def block(name: str, node: dict, now: float) -> str:
    """One node, each line at most WIDTH characters."""
    s = node.get("stats", {})
    latency, queue, workers = s.get("latency_ms", {}), s.get("queue", {}), s.get("workers", {})
    age = f"  stats {now - node['stats_at']:.0f} s old" if "stats_at" in node else "  no stats yet"
    up = f"  up {s['uptime_s']:,.0f} s" if "uptime_s" in s else ""
    errors = "  ".join(f"{code} {n:,}" for code, n in sorted(s.get("errors", {}).items())) or "none"
    span = f" ({workers['min']}-{workers['max']})" if workers.get("min") != workers.get("max") else ""
    lines = [
        f"node {name}  {node.get('status', 'unknown')}{up}{age}",
        f"  requests/s {_num(s.get('requests_per_s'))}   received {_num(s.get('received'))}"
        f"   results {_num(s.get('results'))}",
        f"  latency    p50 {_num(latency.get('p50'))} ms   p99 {_num(latency.get('p99'))} ms",
        f"  errors     {errors}",
        f"  queue      depth {_num(queue.get('depth'))}   busy {_num(queue.get('busy'))}"
        f"   wait {_num(queue.get('predicted_wait_ms'))} ms   workers {_num(workers.get('threads'))}{span}",
    ]
    lines += [f"  drift      {line}" for line in _drift_lines(s.get("drift", {}))]
    return "\n".join(_fit(line) for line in lines)


def _drift_lines(drift: dict) -> list[str]:
    """One line per route with drift watched: its worst PSI, and whether it is drifting."""
    out = []
    for route, state in sorted(drift.items()):
        psi = state.get("psi_max")
        if psi is None:
            ref = state.get("reference", {})
            out.append(f"{route}: no measure yet ({state.get('answers', 0)} answers, "
                       f"reference {ref.get('n') or ref.get('collected', 0)})")
            continue
        out.append(f"{route}: PSI {psi:.3f}{'  DRIFTING' if state.get('drifting') else ''}"
                   f" over {state.get('answers', 0):,} answers")
    return out


def _num(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _fit(line: str) -> str:
    return line if len(line) <= WIDTH else line[: WIDTH - 1] + "…"
