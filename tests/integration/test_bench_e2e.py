"""`edge-inferd bench e2e --quick` end to end: every consumer and phase, any route, sane counts.

Counts only: timings on a shared machine decide nothing here.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import paho.mqtt.client as paho
import pytest
import yaml
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from daemon.config.reader import absolute_paths
from daemon.tools.bench.e2e import ALSO, CONSUMERS, WAIT_500_CONSUMER
from daemon.tools.bench.load import end_session
from tests.integration.conftest import ROOT

BENCH_TIMEOUT_S = 180
REQUESTS = 120

pytestmark = [pytest.mark.serial,  # benchmarks: run alone (scripts/test.sh)
              pytest.mark.skipif(shutil.which("mosquitto_pub") is None or shutil.which("mosquitto_sub") is None,
                                 reason="bench e2e needs the mosquitto C clients: apt-get install mosquitto-clients")]


def _all_answered(row: dict, sent: int, overload: bool = False) -> None:
    assert row["sent"] == sent
    assert row["answered"] + row["lost"] == sent
    assert row["results"] + row["overloaded"] + row["expired"] + row["other_errors"] == row["answered"]
    assert row["other_errors"] == 0
    if not overload:  # at 2x capacity the old daemon loses requests; the bench reports it, the test does not judge
        assert row["lost"] == 0, row


def run_bench(*args: str) -> subprocess.CompletedProcess:
    """`edge-inferd bench e2e ARGS` in a session of its own. On a timeout the whole session is
    killed, the bench's mosquitto, daemons and C clients with it (subprocess.run's timeout kills
    only the bench, and left them running for the rest of the suite)."""
    cmd = [sys.executable, "-m", "daemon", "bench", "e2e", *args]
    with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=BENCH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            pytest.fail(f"bench e2e {' '.join(args)} ran past {BENCH_TIMEOUT_S}s: {stderr[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def test_bench_e2e_quick(tmp_path):
    out = tmp_path / "out"
    proc = run_bench("--quick", "--requests", str(REQUESTS), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "bench-e2e.json").read_text())
    names = [c.name for c in CONSUMERS]
    assert list(results["drain"]) == names
    for row in results["drain"].values():
        _all_answered(row, REQUESTS)
        assert row["rps"] > 0 and row["cpu_us_per_request"] >= 0
    assert list(results["openloop"]) == [*names, WAIT_500_CONSUMER.name]
    for points in results["openloop"].values():
        for point in points:
            _all_answered(point, point["sent"], overload=point["rate_spec"] == "2x")
            assert point["answered"] > 0
    cache = results["cache"]
    assert cache["all_repeat"]["cache_hits"] == REQUESTS  # the same data a third time (admitted on the second): all hits
    assert cache["all_unique"]["cache_hits"] == cache["second_sighting"]["cache_hits"] == 0
    assert 0 < cache["mixed"]["cache_hits"] <= cache["mixed"]["repeats_sent"]
    daemons = [c.name for c in CONSUMERS if c.kind == "daemon"]
    assert list(results["batching"]) == daemons
    for row in results["batching"].values():
        _all_answered(row, REQUESTS)
    assert "drain" in proc.stdout and "batching ratio" in proc.stdout


def _bench(tmp_path, *args: str) -> tuple[dict, str]:
    out = tmp_path / "out"
    proc = run_bench("--quick", "--out", str(out), *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "bench-e2e.json").read_text()), proc.stdout


def test_bench_e2e_runs_any_json_route_of_another_config_in_rounds(tmp_path):
    """An anomaly route in a config of its own: echo, naive, their v5 variants and the daemon each answer
    every request, twice."""
    raw = yaml.safe_load((ROOT / "config.yaml").read_text())
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(absolute_paths({
        **raw, "models": {"load_anomaly": raw["models"]["load_anomaly"]},
        "routes": [r for r in raw["routes"] if r["name"] == "load"]}, ROOT)))
    cpus = sorted(os.sched_getaffinity(0))
    pinned = ["--consumer-cpus", str(cpus[-1])] if len(cpus) > 1 else []  # the consumers on a CPU of their own
    results, stdout = _bench(tmp_path, "--config", str(config), "--route", "load", "--only", "drain",
                             "--rounds", "2", "--requests", "60", "--also", "echo-v5", "--also", "naive-v5", *pinned)
    assert results["meta"]["consumer_cpus"] == ([cpus[-1]] if pinned else [])
    assert results["meta"]["workload"]["route"] == "load"
    assert results["meta"]["workload"]["distinct_int8_inputs"] == 1.0
    assert len(results["rounds"]) == 2
    for one in (*results["rounds"], results):
        assert list(one["drain"]) == [c.name for c in CONSUMERS] + ["echo-v5", "naive-v5"]
        for row in one["drain"].values():
            _all_answered(row, 60)
            assert row["cache_hits"] == 0  # distinct requests: the cache-on daemon finds no repeat
    assert "rounds (medians above)" in stdout


def test_bench_e2e_issue_phases_on_the_second_workload(tmp_path):
    results, stdout = _bench(tmp_path, "--route", "gunpoint", "--only", "burst30k", "--only", "overload",
                             "--only", "openloop1000", "--only", "cachepair", "--burst", "300",
                             "--requests", "100", "--duration", "0.3")
    assert "errors" not in results, results.get("errors")
    burst = results["burst30k"]
    _all_answered(burst, 300)
    assert burst["results"] + sum(burst["error_codes"].values()) == burst["answered"]
    assert burst["cache_hits"] == 0
    overload = results["overload"]
    plain, expiry = overload["no_deadline"], overload["expiry_1s"]
    assert plain["offered_rps"] > overload["capacity"]["rps"]  # past capacity
    _all_answered(plain, plain["sent"])  # no deadline: the broker holds the backlog, nothing is lost
    assert plain["daemon_received"] >= plain["published"] > plain["sent"]  # where a loss happened shows
    assert "the daemon received" in stdout
    assert plain["results_per_s"] > 0 and plain["of_capacity"] > 0
    assert expiry["results"] + expiry["expired"] + expiry["overloaded"] + expiry["other_errors"] + expiry["lost"] \
        == expiry["sent"]
    if expiry["results"]:
        assert expiry["lateness_ms"]["max"] >= expiry["lateness_ms"]["p99"] > 0
    loop = results["openloop1000"]
    for name in ("daemon", "echo"):
        _all_answered(loop[name], loop[name]["sent"])
    assert loop["p99_ratio"] == pytest.approx(loop["daemon"]["result_rtt_ms"]["p99"] / loop["echo"]["result_rtt_ms"]["p99"],
                                              abs=0.01)
    pair = results["cachepair"]
    on, off = pair["daemon"], pair["daemon-nocache"]
    _all_answered(on, 100)
    _all_answered(off, 100)
    assert on["cache_hits"] == 0 and pair["cpu_us_diff"] == pytest.approx(on["cpu_us_per_request"] -
                                                                          off["cpu_us_per_request"], abs=0.11)
    assert "burst30k:" in stdout and "overload:" in stdout and "cache on minus off" in stdout


@pytest.mark.parametrize("protocol, correlated", [(None, False), ("5", True)])
def test_the_echo_runs_paho_defaults_unless_told_v5(broker, protocol, correlated):
    """By default the echo is the script people write: MQTT 3.1.1, so a v5 request's CorrelationData
    cannot come back; `--protocol 5` (the bench's echo-v5) runs v5 and returns it."""
    replies, online = [], []
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id="asker", protocol=paho.MQTTv5)
    client.on_message = lambda c, u, msg: (online if msg.topic.endswith("/status") else replies).append(msg)
    client.connect("127.0.0.1", broker.port)
    client.subscribe([("results/#", 1), ("edge-inferd/echo-under-test/status", 1)])
    cmd = [sys.executable, "-m", "daemon.tools.baselines", "echo", "--broker", broker.address, "--route", "gunpoint",
           "--client-id", "echo-under-test", *(["--protocol", protocol] if protocol else [])]
    with subprocess.Popen(cmd, cwd=ROOT) as echo:
        try:
            _loop_until(client, lambda: any(m.payload == b"online" for m in online))
            props = Properties(PacketTypes.PUBLISH)
            props.CorrelationData = b"42"
            client.publish("sensors/g1/gesture", b'{"id": 42, "data": []}', qos=1, properties=props)
            _loop_until(client, lambda: replies)
        finally:
            echo.terminate()
    assert replies[0].payload.strip() == b'{"id":42}'
    assert (getattr(replies[0].properties, "CorrelationData", None) == b"42") is correlated


def _loop_until(client: paho.Client, done, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "no answer in time"
        client.loop(0.1)


def test_end_session_leaves_the_broker_no_session_to_resume(broker):
    def resumes(client_id: str) -> bool:
        """Connect with clean_start false: did the broker still hold a session for this id?"""
        found = {}
        c = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv5)
        c.on_connect = lambda client, userdata, flags, rc, props: found.setdefault("present", flags.session_present)
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 3600
        c.connect("127.0.0.1", broker.port, clean_start=False, properties=props)
        while "present" not in found:
            c.loop(0.1)
        c.disconnect()
        return found["present"]

    resumes("bench-daemon-1")  # creates the persistent session
    assert resumes("bench-daemon-1")  # the broker kept it: what a later round would inherit
    end_session(broker.address, "bench-daemon-1")
    assert not resumes("bench-daemon-1")
