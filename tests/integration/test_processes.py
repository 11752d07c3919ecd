"""`workers.processes: 2` over a real mosquitto: one node, two worker processes in a share group.

The parent keeps the node's status and summed stats; each child has its own connection
(`edge-inferd-w<i>`) and logs with its `[w<i>]` prefix, so its share is read from its own
final "stopped; stats" line.
"""

from __future__ import annotations

import json
import os
import re
import signal

from tests.integration.conftest import ROOT, WAIT_S, Client, activity_payloads, burst, wait_unique_ids, write_config

N = 2000
STATUS = "edge-inferd/edge-inferd/status"


def _child_received(log: str) -> dict[str, int]:
    """Each child's `received` from its last "stopped; stats" line."""
    found = {}
    for index, stats in re.findall(r"\[w(\d+)\].*stopped; stats (\{.*\})", log):
        found[index] = json.loads(stats)["counts"].get("received", 0)
    return found


def _child_pids(log: str) -> dict[str, int]:
    return {index: int(pid) for index, pid in re.findall(r"worker w(\d+) started \(pid (\d+)\)", log)}


def test_two_processes_split_a_stream_each_request_answered_once(tmp_path, broker, start_daemon):
    collector = Client(broker)
    config = write_config(tmp_path, cache={"enabled": False}, workers={"processes": 2, "max": 1})
    daemon = start_daemon(config, wait_online=collector)
    collector.subscribe("results/s1/activity")
    burst(collector, "sensors/s1/imu", activity_payloads(N))
    replies = wait_unique_ids(collector, "results/s1/activity", N)
    assert sorted(r["id"] for r in replies) == list(range(N))  # every request once: none lost, none doubled
    collector.subscribe("edge-inferd/edge-inferd/stats")
    assert daemon.stop(signal.SIGTERM) == 0, daemon.log()
    collector.wait_payload(STATUS, b"offline")
    shares = _child_received(daemon.log())
    assert sum(shares.values()) == N and min(shares.values()) >= 0.2 * N, shares
    node = json.loads(collector.on("edge-inferd/edge-inferd/stats")[-1].payload)
    assert node["workers"]["processes"] == 2 and node["received"] == N, node  # the node's stats are the sum
    collector.close()


def _two_processes_with_a_burst(tmp_path, broker, start_daemon):
    """A node of two single-thread, batch-1 worker processes (a burst takes a while), sent N requests."""
    collector = Client(broker)
    config = write_config(tmp_path, cache={"enabled": False}, workers={"processes": 2, "max": 1},
                          batching={"max_batch": 1})
    daemon = start_daemon(config, wait_online=collector)
    collector.subscribe("results/s1/activity")
    burst(collector, "sensors/s1/imu", activity_payloads(N))
    return collector, daemon


def test_a_killed_worker_process_is_restarted_and_its_requests_redelivered(tmp_path, broker, start_daemon):
    collector, daemon = _two_processes_with_a_burst(tmp_path, broker, start_daemon)
    with collector.cond:  # mid-stream: some replies out, most requests still to serve
        assert collector.cond.wait_for(lambda: len(collector.on("results/s1/activity")) >= N // 10, WAIT_S)
    os.kill(_child_pids(daemon.log())["0"], signal.SIGKILL)
    assert daemon.wait_for_log("worker w0 started", count=2), daemon.log()  # restarted by the parent
    replies = wait_unique_ids(collector, "results/s1/activity", N)
    assert {r["id"] for r in replies} == set(range(N)), daemon.log()[-3000:]  # nothing lost
    assert daemon.stop(signal.SIGTERM) == 0, daemon.log()
    collector.close()


def test_a_worker_process_failing_with_78_stops_the_node_with_78(tmp_path, broker, start_daemon):
    bad = tmp_path / "garbage.tflite"
    bad.write_bytes(b"not a model" * 100)
    config = write_config(tmp_path, workers={"processes": 2},
                          models={"activity": {"path": str(bad), "labels": str(ROOT / "models/activity/labels.txt")}})
    daemon = start_daemon(config)
    assert daemon.proc.wait(WAIT_S) == 78, daemon.log()
    assert "stopping the node" in daemon.log()


def test_sigterm_drains_every_worker_process_and_the_node_goes_offline(tmp_path, broker, start_daemon):
    collector, daemon = _two_processes_with_a_burst(tmp_path, broker, start_daemon)
    daemon.proc.send_signal(signal.SIGTERM)  # as soon as the broker has them all
    assert daemon.stop() == 0, daemon.log()
    collector.wait_payload(STATUS, b"offline")
    shares = _child_received(daemon.log())
    assert len(shares) == 2, daemon.log()  # both children drained and logged their final stats
    answered = wait_unique_ids(collector, "results/s1/activity", sum(shares.values()))
    assert len({r["id"] for r in answered}) == sum(shares.values())  # each received request answered
    collector.close()
