"""`edge-inferd status --watch`'s table: what an operator reads, in a plain 80-column terminal."""

from __future__ import annotations

from daemon.obs import stats_topic
from daemon.obs.stats import Stats
from daemon.tools import status_watch

NOW = 1_700_000_000.0


def _stats() -> dict:
    stats = Stats()
    for _ in range(1234):
        stats.incr("received")
    stats.incr("errors.overloaded", 3)
    stats.incr("errors.expired", 2)
    out = stats_topic.payload(stats.snapshot(), 3600.0, {"activity": "ab" * 32}, 2,
                              {"depth": 5, "busy": 1, "bytes": 4096, "predicted_wait_ms": 12.5},
                              scaling={"min": 1, "max": 4, "scale_ups": 1, "scale_downs": 0})
    out["requests_per_s"] = 123.45
    out["drift"] = {
        "activity": {"kind": "classify", "answers": 500, "window": 500, "psi_max": 0.312, "drifting": True,
                     "reference": {"source": "validate", "n": 100}},
        "a-route-whose-name-is-long-enough-to-run-past-the-eightieth-column-of-the-terminal":
            {"kind": "anomaly", "answers": 12, "window": 500, "psi_max": None, "drifting": False,
             "reference": {"source": "first answers", "n": 0, "collected": 12, "wanted": 200}},
    }
    return out


def test_the_table_shows_what_the_operator_watches_within_80_columns():
    nodes = {"edge-inferd-gw1": {"status": "online", "stats": _stats(), "stats_at": NOW - 4}}
    table = status_watch.render(nodes, NOW, "edge-inferd status --watch: gateway:1883, every 2 s (Ctrl-C stops)")
    lines = table.splitlines()
    assert all(len(line) <= status_watch.WIDTH for line in lines), [len(line) for line in lines]
    assert "node edge-inferd-gw1  online  up 3,600 s  stats 4 s old" in table
    assert "requests/s 123.5   received 1,234" in table
    assert "p50 " in table and "p99 " in table
    assert "errors     expired 2  overloaded 3" in table
    assert "queue      depth 5   busy 1   wait 12.5 ms   workers 2 (1-4)" in table
    assert "drift      activity: PSI 0.312  DRIFTING over 500 answers" in table
    long_line = next(line for line in lines if "a-route-whose-name" in line)
    assert long_line.endswith("…") and len(long_line) == status_watch.WIDTH  # cut, not wrapped


def test_a_node_without_stats_yet_and_no_node_at_all_say_so():
    assert "no stats yet" in status_watch.render({"n1": {"status": "online"}}, NOW)
    assert "no edge-inferd node has published yet" in status_watch.render({}, NOW)
