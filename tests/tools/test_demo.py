"""The demo's printout: the first replies per route, "wrong" marks, and a summary that says
its round trips are measured with WINDOW requests outstanding. (./scripts/demo.sh runs it all.)"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from daemon.tools.demo import FIRST_ANSWERS, WINDOW, RouteRun, answer_lines, summary_lines


def _run(n: int, wrong: set[int] = frozenset()) -> RouteRun:
    labels = ["sitting", "walking"]
    run = RouteRun(SimpleNamespace(name="activity"), np.zeros((n, 1)), np.zeros(n, dtype=int), labels)
    for i in range(n):
        run.sent_at[i] = 0.0
        run.answers[i] = {"label": labels[1 if i in wrong else 0], "score": 0.9, "latency_ms": 0.5 + i % 2,
                          "cached": False}
        run.rtt_ms[i] = 20.0 + i
    return run


def test_first_replies_then_how_many_more():
    lines = answer_lines(_run(12, wrong={1}))
    assert len(lines) == FIRST_ANSWERS + 1
    assert " wrong walking " in lines[1] and "expected sitting" in lines[1] and "MISS" not in lines[1]
    assert " ok " in lines[0] and "cached=false" in lines[0]
    assert lines[-1].endswith(f"{12 - FIRST_ANSWERS} more (-v prints every reply)")


def test_verbose_prints_every_reply():
    assert len(answer_lines(_run(12), verbose=True)) == 12
    assert len(answer_lines(_run(3))) == 3  # nothing left out, no "more" line


def test_summary_states_the_concurrency_and_the_daemons_own_latency():
    header, line = summary_lines({"activity": _run(10, wrong={0})})
    assert f"{WINDOW} requests outstanding" in header
    assert "accuracy 0.900" in line and "answered 10/10 (0 errors)" in line
    assert "daemon p50 1.0 ms" in line and "round trip p50 24.5 ms" in line
