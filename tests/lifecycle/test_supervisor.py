"""The supervisor's decisions with a fake clock (no processes), the child's derived config,
the heartbeat file, and the node's summed stats."""

from __future__ import annotations

from pathlib import Path

from daemon.lifecycle import heartbeat
from daemon.config.loader import load_config
from daemon.obs.node_sums import fold, summed
from daemon.lifecycle.supervisor import Rules, child_config, child_env

ROOT = Path(__file__).resolve().parents[2]


def test_restart_backoff_doubles_to_its_cap_and_a_healthy_run_resets_the_streak():
    rules = Rules(backoff_min_s=1.0, backoff_max_s=30.0, healthy_after_s=60.0)
    failures, delays = 0, []
    for _ in range(7):
        failures = rules.failures_after(failures, ran_s=2.0)  # crashes right after each start
        delays.append(rules.restart_delay(failures))
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert rules.restart_delay(rules.failures_after(failures, ran_s=61.0)) == 1.0


def test_a_child_is_stuck_when_its_heartbeat_is_older_than_the_limit():
    rules = Rules(stale_s=30.0, boot_s=120.0)
    started = 1000.0
    assert not rules.stuck(now=1100.0, started_at=started, beat_at=1075.0)  # beat 25 s ago
    assert rules.stuck(now=1106.0, started_at=started, beat_at=1075.0)  # 31 s ago: killed
    assert not rules.stuck(now=1119.0, started_at=started, beat_at=None)  # still booting
    assert rules.stuck(now=1121.0, started_at=started, beat_at=None)  # never beat within boot_s
    assert rules.stuck(now=1121.0, started_at=started, beat_at=900.0)  # the previous run's beat does not count


def test_a_child_gets_its_own_id_outbox_and_the_node_share_group(tmp_path):
    config = load_config(ROOT / "config.yaml", check_models=False)
    child = child_config(config, 1)
    assert child.mqtt.client_id == f"{config.mqtt.client_id}-w1"
    assert child.mqtt.status_topic == f"edge-inferd/{config.mqtt.client_id}-w1/status"  # never the node's
    assert child.mqtt.share_group == config.mqtt.client_id  # none configured: derived from the node id
    assert child.mqtt.outbox.dir == config.mqtt.outbox.dir / "w1"
    assert child.workers.processes == 1 and child.metrics.port is None
    env = child_env(1, tmp_path / "w1.json", {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "1", "PATH": "/bin"})
    assert "NOTIFY_SOCKET" not in env and "WATCHDOG_USEC" not in env and env["PATH"] == "/bin"
    assert env[heartbeat.INDEX_ENV] == "1"


def test_the_heartbeat_is_written_only_while_progressing(tmp_path):
    path = tmp_path / "w0.json"
    beat = heartbeat.Heartbeat(path, lambda: {"received": 3})
    beat.watchdog(False)
    assert heartbeat.read(path) is None
    beat.watchdog(True)
    assert heartbeat.read(path)["ready"] is False
    beat.ready("serving")
    assert heartbeat.read(path) == {"ready": True, "pid": heartbeat.os.getpid(), "stats": {"received": 3}}


def test_node_stats_sum_the_children_and_keep_what_a_restarted_child_counted():
    def stats(n: int) -> dict:
        return {"received": n, "results": n - 1, "errors": {"bad_payload": 1}, "counts": {"received": n},
                "cache": {"hits": n, "disk_hits": 0, "misses": n}, "queue": {"depth": 2},
                "workers": {"threads": 2, "busy": 1}, "latency_ms": {"p50": float(n), "p99": 2.0 * n},
                "models": {"activity": {"loaded": True}}}
    node = summed({"n-w0": {"stats": stats(10), "past": fold({}, stats(5)), "restarts": 1, "ready": True},
                   "n-w1": {"stats": stats(20), "past": {}, "restarts": 0, "ready": True}}, 12.0)
    assert node["received"] == 35 and node["results"] == 32 and node["errors"] == {"bad_payload": 3}
    assert node["cache"]["hit_rate"] == 0.5 and node["queue"] == {"depth": 4}
    assert node["workers"] == {"processes": 2, "threads": 4, "busy": 2}
    assert node["latency_ms"] == {"p50": 20.0, "p99": 40.0}  # the worst child's
    assert node["children"]["n-w0"] == {"received": 10, "results": 9, "restarts": 1, "ready": True}
    assert set(node) >= {"received", "results", "errors", "cache", "queue", "workers", "models", "latency_ms",
                         "reconnects", "outbox", "uptime_s"}


def test_a_restarted_childs_counters_add_up_in_one_total_and_its_levels_end_with_it():
    """Counters of every incarnation are kept, in one dict however often it restarts; levels
    (cache entries and bytes, outbox rows) of a process that ended are not the node's any more."""
    def stats(n: int) -> dict:
        return {"received": n, "results": n, "errors": {"expired": 1}, "counts": {"inferences": n},
                "cache": {"entries": 7, "bytes": 700, "hits": n, "disk_hits": 0, "misses": n},
                "outbox": {"unconfirmed": 3, "stored": 2, "bytes": 200, "dropped": 1, "flushed": n}}
    past: dict = {}
    for n in (1, 2, 3):  # three incarnations ended
        past = fold(past, stats(n))
    assert past["received"] == 6 and past["errors"] == {"expired": 3} and past["counts"] == {"inferences": 6}
    assert past["outbox"] == {"dropped": 3, "flushed": 6} and "entries" not in past["cache"]
    node = summed({"n-w0": {"stats": stats(10), "past": past, "restarts": 3, "ready": True}}, 1.0)
    assert node["received"] == 16 and node["errors"] == {"expired": 4}
    assert node["cache"]["entries"] == 7 and node["cache"]["bytes"] == 700 and node["cache"]["hits"] == 16
    assert node["outbox"] == {"unconfirmed": 3, "stored": 2, "bytes": 200, "dropped": 4, "flushed": 16}


def test_the_heartbeat_beats_at_most_once_per_interval_however_fast_the_loop_ticks(tmp_path):
    now, snapshots = [0.0], []
    beat = heartbeat.Heartbeat(tmp_path / "w0.json", lambda: snapshots.append(now[0]) or {}, clock=lambda: now[0])
    for tick in range(41):  # 2 s of a main loop ticking every 50 ms (near an idle unload)
        now[0] = tick * 0.05
        beat.watchdog(True)
    assert snapshots == [0.0, heartbeat.HEARTBEAT_INTERVAL_S]
    beat.final()  # the stats at stop are written whatever the interval
    assert snapshots[-1] == 2.0 and len(snapshots) == 3
