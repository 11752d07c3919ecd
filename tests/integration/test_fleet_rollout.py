"""`fleet rollout` and `fleet status` (daemon/fleet/controller/controller.py) against three REAL daemons on
one mosquitto, with signed releases on an HTTP server (tests/integration/fleet_site.py): what
tests/fleet/controller/test_controller.py shows against scripted nodes, here with the nodes' own fetch,
gate, canary and reported documents.

The canary needs live answers (`canary.min_answers` 30 over `duration_s` 1): a `Traffic` thread
feeds every node's request topic while a rollout runs, as a site's sensors would. min_answers 0
would skip the very step whose timing a rollout's figure is about. The good rollout and the
busy-nodes test run canaries long enough to judge latency and PSI (JUDGING_CANARY), and say so.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from daemon.fleet.controller import controller
from daemon.fleet.controller.controller import RolloutOptions, StatusOptions
from tests.integration.conftest import ROOT, WAIT_S, Client, activity_payloads, burst
from tests.busy import BusyLoops
from tests.integration.fleet_site import (ACTIVITY, ACTIVITY_FLOAT_IO, SLOWER, Site, Traffic, permuted, reported,
                                          requests_topic, results_topic)

pytestmark = pytest.mark.integration
NODES = ["gw1", "gw2", "gw3"]
MODEL = "activity"
RECORD = f"edge-inferd/fleet/rollout/{MODEL}"
DESIRED = "edge-inferd/fleet/desired/node/"
WAVE_TIMEOUT_S = 120.0  # bounds a failing test only: a node's whole install takes seconds
# A canary that reaches the PSI's minimum (daemon/fleet/node/canary.py; the latency needs no
# traffic: canary_probe.py): 200 answers of each release for a route's PSI; the previous
# release's are its answers before the swap, so each node answers PREVIOUS_ANSWERS first, and the
# requests go one at a time (an invoke per answer, as at a quiet site).
JUDGING_CANARY = {"duration_s": 1, "min_answers": 200}
PREVIOUS_ANSWERS = 200


def judging_traffic(client: Client) -> "Traffic":
    """Traffic for JUDGING_CANARY, once every node has answered PREVIOUS_ANSWERS on what it runs."""
    traffic = Traffic(client, NODES, batch=1, every_s=0.01)
    for node in NODES:
        client.wait_count(results_topic(node), PREVIOUS_ANSWERS)
    return traffic


@pytest.fixture
def site(tmp_path):
    s = Site(tmp_path)
    yield s
    s.close()


@pytest.fixture
def fleet(site, start_daemon, client, tmp_path):
    """start(**settings): the three daemons (`settings[node]`: that node's fleet section overrides),
    each online and with its first reported document in; the client follows the record and every
    desired document from before the rollout. The three start together (each waits for nothing
    of the others), then each is waited for online."""
    def start(**settings: dict) -> list[str]:
        client.subscribe(RECORD)
        client.subscribe(DESIRED + "+")
        for node in NODES:
            client.subscribe(f"edge-inferd/{node}/status")
        for node in NODES:
            start_daemon(site.config(tmp_path / node, client_id=node, **settings.get(node, {})))
        for node in NODES:
            client.wait_payload(f"edge-inferd/{node}/status", b"online")
        for node in NODES:
            reported(client, node, lambda m: True)
        return NODES

    return start


def options(broker, url: str, serial: int, **changes) -> RolloutOptions:
    return RolloutOptions(broker.address, MODEL, url, serial, **{"waves": "1,2,100%", "wave_timeout_s": WAVE_TIMEOUT_S,
                                                                  **changes})


def serving(client: Client, node: str, n: int = 10) -> set:
    """The model_sha256 set that answered `n` fresh requests to `node`."""
    topic = results_topic(node)
    if topic not in client.topics:
        client.subscribe(topic)
    before = len(client.on(topic))
    burst(client, requests_topic(node), activity_payloads(n))
    replies = [json.loads(m.payload) for m in client.wait_count(topic, before + n)[before:]]
    assert all("error" not in r for r in replies), replies[:3]
    return {r["model_sha256"] for r in replies}


def desired_revs(client: Client, node: str) -> list[int]:
    """The rev of every desired document of `node` published since the client subscribed."""
    return [json.loads(m.payload)["rev"] for m in client.on(DESIRED + node) if m.payload]


def record(client: Client, predicate) -> dict:
    return client.wait_json_until(RECORD, predicate)


def assert_all_active(client: Client, serial: int) -> None:
    for node in NODES:
        entry = reported(client, node, lambda m: m["state"] == "active" and m["serial"] == serial)["models"][MODEL]
        assert entry["canary"]["answers"] >= 30 and entry["rejected"] == [], (node, entry)


def test_a_good_release_rolls_out_to_three_real_nodes_and_status_lists_them(site, fleet, broker, client):
    fleet(**{node: {"canary": JUDGING_CANARY} for node in NODES})
    url = site.release(2, "1.1.0", ACTIVITY_FLOAT_IO)
    traffic = judging_traffic(client)
    out = io.StringIO()
    started = time.monotonic()
    try:
        code = controller.rollout(options(broker, url, 2, version="1.1.0"), out)
    finally:
        traffic.stop()
    print(f"a three-node rollout's time (waves 1,2,100%, canary 1 s / 200 answers, latency and PSI judged): "
          f"{time.monotonic() - started:.2f} s")
    assert code == 0, out.getvalue()
    done = record(client, lambda r: r["state"] == "completed")
    assert done["assigned"] == {"gw1": 0, "gw2": 1, "gw3": 2}
    assert done["result"] == {node: "active" for node in NODES}
    assert_all_active(client, 2)
    for node in NODES:
        _judged(reported(client, node, lambda m: m["state"] == "active")["models"][MODEL])
    assert {node: desired_revs(client, node) for node in NODES} == {node: [1] for node in NODES}
    text = out.getvalue()
    for line in ("wave 1/3: gw1", "gw1: canary", "gw1: active serial 2", "wave 3/3 passed",
                 "rollout of activity serial 2 completed: 3 of 3 nodes assigned; 3 active"):
        assert line in text, text
    status = io.StringIO()
    assert controller.status(StatusOptions(broker.address, json=True), status) == 0
    rows = [(r["node"], r["model"], r["version"], r["serial"], r["state"]) for r in json.loads(status.getvalue())]
    assert rows == [(node, MODEL, "1.1.0", 2, "active") for node in NODES], rows


def test_a_release_the_gate_refuses_stops_on_the_first_wave_and_every_node_serves_the_old_one(site, fleet, broker,
                                                                                              client):
    fleet()
    before = {node: serving(client, node) for node in NODES}
    url = site.release(2, "1.1.0", labels=permuted(ACTIVITY / "labels.txt"))
    out = io.StringIO()
    assert controller.rollout(options(broker, url, 2, on_abort="rollback"), out) == 1, out.getvalue()
    aborted = record(client, lambda r: r["state"] == "aborted")
    assert aborted["assigned"] == {"gw1": 0} and aborted["result"] == {"gw1": "failed"}
    entry = reported(client, "gw1", lambda m: m["state"] == "failed")["models"][MODEL]
    assert entry["error"]["code"] == "gate" and entry["rejected"][-1]["serial"] == 2
    assert desired_revs(client, "gw2") == [] and desired_revs(client, "gw3") == []
    assert desired_revs(client, "gw1") == [1, 2]
    restored = json.loads(client.on(DESIRED + "gw1")[-1].payload)
    assert restored["models"] == {}  # gw1 had no entry before: the rollout's is taken away
    assert "gw1: failed gate" in out.getvalue() and "gw1: desired entry removed (rev 2)" in out.getvalue()
    assert {node: serving(client, node) for node in NODES} == before


def _controller_process(broker, url: str, log) -> subprocess.Popen:
    call = (f"c.rollout(c.RolloutOptions({broker.address!r}, {MODEL!r}, {url!r}, 2, waves='1,2,100%', "
            f"wave_timeout_s={WAVE_TIMEOUT_S}), sys.stdout)")
    code = f"import sys\nfrom daemon.fleet.controller import controller as c\nsys.exit({call})"
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"})


def test_a_controller_killed_mid_rollout_resumes_and_assigns_no_node_twice(site, fleet, broker, client, tmp_path):
    fleet()
    url = site.release(2, "1.1.0", ACTIVITY_FLOAT_IO)
    traffic = Traffic(client, NODES)
    try:
        first = _controller_process(broker, url, tmp_path / "first.log")
        record(client, lambda r: r["result"].get("gw1") == "active")
        first.kill()
        assert first.wait(WAIT_S) == -9, (tmp_path / "first.log").read_text()
        out = io.StringIO()
        code = controller.rollout(options(broker, url, 2), out)
    finally:
        traffic.stop()
    assert code == 0, (tmp_path / "first.log").read_text() + out.getvalue()
    assert "resuming the rollout" in out.getvalue()
    done = record(client, lambda r: r["state"] == "completed")
    assert done["assigned"] == {"gw1": 0, "gw2": 1, "gw3": 2} and done["revs"] == {node: 1 for node in NODES}
    assert {node: desired_revs(client, node) for node in NODES} == {node: [1] for node in NODES}
    assert_all_active(client, 2)


def test_a_rollout_rides_out_a_broker_restart_and_the_daemons_come_back(site, fleet, broker, client):
    # gw2 activates by hand (`activation: manual`): it waits staged, so the restart is mid-rollout
    # however fast the machine, as fake_node's hold_at does for the scripted nodes.
    fleet(gw2={"activation": "manual"})
    url = site.release(2, "1.1.0", ACTIVITY_FLOAT_IO)
    traffic = Traffic(client, NODES)
    result: dict = {}

    def run() -> None:
        out = io.StringIO()
        result["code"] = controller.rollout(options(broker, url, 2), out)
        result["out"] = out.getvalue()

    thread = threading.Thread(target=run, daemon=True)
    try:
        thread.start()
        reported(client, "gw2", lambda m: m["state"] == "staged" and m["staged"] == 2)
        broker.stop()  # SIGTERM: mosquitto saves its retained documents and the sessions (persistence is on)
        broker.start()
        # QoS 1, not waited for: paho keeps it until the test client has reconnected, and the broker
        # keeps it in gw2's persistent session until the daemon has.
        client.c.publish("edge-inferd/gw2/fleet/cmd", json.dumps({"cmd": "install", "model": MODEL}), qos=1)
        thread.join(WAVE_TIMEOUT_S * 3)
    finally:
        traffic.stop()
    assert result.get("code") == 0, result
    assert "gw2: staged" in result["out"], result["out"]
    done = record(client, lambda r: r["state"] == "completed")
    assert done["revs"] == {node: 1 for node in NODES} and done["result"] == {node: "active" for node in NODES}
    assert_all_active(client, 2)
    for node in NODES:
        assert len(serving(client, node)) == 1  # each daemon answers again, with one model


def test_an_abort_keeps_the_node_active_on_the_release_and_fleet_rollback_never_moves_one_forward(site, fleet,
                                                                                                  broker, client):
    """gw1 runs serial 2, then goes active on serial 3 in wave 1; gw2 trusts another key and refuses 3
    (untrusted_key) in wave 2, which aborts the rollout. gw1 keeps serial 3, refused nowhere as
    `operator`. Then gw1 is sent down to its kept serial 2 (as an abort once did to such a node):
    `fleet rollback` takes it on down to its configured files, never up onto the aborted 3."""
    from daemon.fleet.release import minisign
    from daemon.fleet.controller.controller import RollbackOptions
    from tests.integration.fleet_site import desire

    fleet(gw2={"trusted_keys": [minisign.generate().public_key.line]})
    second, third = site.release(2, "1.1.0", ACTIVITY_FLOAT_IO), site.release(3, "1.2.0")
    traffic = Traffic(client, NODES)
    out = io.StringIO()
    try:
        desire(client, "gw1", 1, second, 2)
        reported(client, "gw1", lambda m: m["state"] == "active" and m["serial"] == 2)
        code = controller.rollout(options(broker, third, 3, waves="1,100%", nodes=("gw1", "gw2")), out)
        aborted = record(client, lambda r: r["state"] == "aborted")
        desire(client, "gw1", desired_revs(client, "gw1")[-1] + 1, second, 2)
        reported(client, "gw1", lambda m: m["state"] == "active" and m["serial"] == 2)
    finally:
        traffic.stop()
    assert code == 1 and aborted["result"] == {"gw1": "active", "gw2": "failed"}, out.getvalue()
    assert "gw1: active on serial 3: keeps it" in out.getvalue() and desired_revs(client, "gw1") == [1, 2, 3]
    kept = [json.loads(m.payload)["models"][MODEL] for m in client.on("edge-inferd/gw1/fleet/reported")]
    assert all(r["code"] != "operator" for entry in kept for r in entry["rejected"]), kept[-1]
    refused = reported(client, "gw2", lambda m: m["state"] == "failed")["models"][MODEL]["rejected"]
    assert [(r["serial"], r["version"], r["code"]) for r in refused] == [(3, "1.2.0", "untrusted_key")]
    back = io.StringIO()
    assert controller.rollback(RollbackOptions(broker.address, MODEL, nodes=("gw1",)), back) == 0, back.getvalue()
    assert back.getvalue() == "gw1: rolled_back to its configured files\n"
    entry = reported(client, "gw1", lambda m: m["state"] == "rolled_back")["models"][MODEL]
    assert entry["serial"] is None and entry["rejected"][-1]["serial"] == 2


def test_a_second_rollout_then_fleet_rollback_sends_every_node_back_to_the_first(site, fleet, broker, client):
    from daemon.fleet.controller.controller import RollbackOptions

    fleet()
    first, second = site.release(2, "1.1.0", ACTIVITY_FLOAT_IO), site.release(3, "1.2.0")
    traffic = Traffic(client, NODES)
    try:
        for url, serial in ((first, 2), (second, 3)):
            out = io.StringIO()
            assert controller.rollout(options(broker, url, serial, waves="100%"), out) == 0, out.getvalue()
    finally:
        traffic.stop()
    done = record(client, lambda r: r["state"] == "completed" and r["serial"] == 3)
    assert done["previous"] == {node: {"url": first, "serial": 2} for node in NODES}
    assert {node: desired_revs(client, node) for node in NODES} == {node: [1, 2] for node in NODES}
    out = io.StringIO()
    assert controller.rollback(RollbackOptions(broker.address, MODEL), out) == 0, out.getvalue()
    assert out.getvalue().splitlines() == [f"{node}: rolled_back to serial 2" for node in NODES]
    for node in NODES:
        entry = reported(client, node, lambda m: m["state"] == "rolled_back")["models"][MODEL]
        assert entry["serial"] == 2 and entry["rejected"][-1]["code"] == "operator"



def _judged(entry: dict) -> dict:
    canary = entry["canary"]
    assert canary["not_judged"] == [] and canary["latency_ratio"] is not None and canary["psi"] is not None, canary
    return canary


def _rollout_under_load(client: Client, load: BusyLoops, options: RolloutOptions) -> tuple[int, str]:
    """`fleet rollout` (waves 100%), the busy loops on from the moment every node's canary runs
    until the rollout is over: the gates (nice 10) need not wait for them."""
    result: dict = {}

    def run() -> None:
        out = io.StringIO()
        result["code"], result["out"] = controller.rollout(options, out), out.getvalue()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        for node in NODES:
            reported(client, node, lambda m: m["serial"] == options.serial or m["state"] in ("failed", "rolled_back"))
        load.set(True)
        thread.join(WAVE_TIMEOUT_S * 2)
    finally:
        load.set(False)
    return result.get("code", -1), result.get("out", "the rollout did not end")


@pytest.mark.serial  # a busy loop per core: run alone (scripts/test.sh)
def test_on_three_busy_nodes_identical_bytes_pass_a_judged_canary_and_a_slower_build_is_rolled_back(
        site, fleet, broker, client):
    """The issue's site: three nodes on one 2-core machine, here with a busy loop on each core
    besides during the canaries (tests/busy.py). A release of the very bytes that run passes every
    node's canary with latency and PSI judged; a build doing the graph five times with the same
    answers (tests/fixtures/activity_x3) is rolled back by every node's canary, on its CPU time
    alone. `on_abort: halt`: the controller leaves the desired documents, so each node's own
    canary decides."""
    fleet(**{node: {"canary": JUDGING_CANARY} for node in NODES})
    same, slower = site.release(2, "1.0.1"), site.release(3, "1.1.0", SLOWER)
    started = time.monotonic()
    traffic = judging_traffic(client)
    try:
        with BusyLoops() as load:
            code, out = _rollout_under_load(client, load, options(broker, same, 2, waves="100%"))
            assert code == 0, out
            passed = [_judged(reported(client, node, lambda m: m["state"] == "active" and m["serial"] == 2)
                              ["models"][MODEL]) for node in NODES]
            code, out = _rollout_under_load(client, load, options(broker, slower, 3, waves="100%", on_abort="halt"))
            assert code == 1, out
            failed = [reported(client, node, lambda m: m["state"] == "rolled_back")["models"][MODEL] for node in NODES]
    finally:
        traffic.stop()
    print(f"identical bytes on three busy nodes: CPU time per sample {[c['latency_ratio'] for c in passed]}x, "
          f"PSI {[c['psi'] for c in passed]}, {[c['latency_invokes'] for c in passed]} invokes compared; "
          f"the slower build: {[e['canary']['latency_ratio'] for e in failed]}x; {time.monotonic() - started:.1f} s")
    for entry in failed:
        assert entry["serial"] == 2 and entry["error"]["code"] == "canary", entry
        assert "CPU time per sample" in entry["error"]["message"] and entry["rejected"][-1]["serial"] == 3, entry
