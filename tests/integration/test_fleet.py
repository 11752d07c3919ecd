"""Fleet delivery on a real node: a real daemon, mosquitto, an HTTP release server, signed releases.

Each fault leaves the old model serving and says why in the retained reported document
(docs/fleet.md). The releases are the bundled activity model and a second build of it with a
float32 interface (another sha256, the same answers), signed by `fleet sign`'s own code.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time

import pytest

from daemon.fleet.release import minisign
from tests.integration.conftest import Client, activity_payloads, burst
from tests.integration.fleet_site import (ACTIVITY, ACTIVITY_FLOAT_IO, GUNPOINT, Site, claim_on, desire, permuted,
                                          reported, skewed_payloads)

pytestmark = pytest.mark.integration
NODE = "gw1"
REQUESTS = f"sensors/{NODE}/dev1/imu"
RESULTS = f"results/{NODE}/dev1/activity"


@pytest.fixture
def site(tmp_path):
    s = Site(tmp_path)
    yield s
    s.close()


def answered_by(client: Client, payloads: list[bytes], node: str = NODE) -> set:
    """Send `payloads` (distinct ids) to `node` and the set of model_sha256 that answered them."""
    requests, results = f"sensors/{node}/dev1/imu", f"results/{node}/dev1/activity"
    before = len(client.on(results))
    burst(client, requests, payloads)
    replies = [json.loads(m.payload) for m in client.wait_count(results, before + len(payloads))[before:]]
    assert all("error" not in r for r in replies), replies[:3]
    return {r["model_sha256"] for r in replies}


def test_a_release_goes_from_desired_to_active_and_serves(site, start_daemon, client, tmp_path):
    config = site.config(tmp_path / "gw1")
    start_daemon(config, wait_online=client, client_id=NODE)
    client.subscribe(RESULTS)
    first = answered_by(client, activity_payloads(20))
    url = site.release(2, "1.1.0", ACTIVITY_FLOAT_IO, summary="float interface build")
    reported(client, NODE, lambda m: True)  # subscribed before the desire: every state it goes through is seen
    started = time.monotonic()
    desire(client, NODE, 1, url, 2)
    reported(client, NODE, lambda m: m["state"] == "canary" and m["serial"] == 2)
    second = answered_by(client, activity_payloads(60))  # the canary's answers
    doc = reported(client, NODE, lambda m: m["state"] == "active" and m["serial"] == 2)
    print(f"desired -> active: {time.monotonic() - started:.2f} s")
    entry = doc["models"]["activity"]
    states = [json.loads(m.payload)["models"]["activity"]["state"]
              for m in client.on(f"edge-inferd/{NODE}/fleet/reported")]
    steps = [state for i, state in enumerate(states) if i == 0 or state != states[i - 1]]
    # The protocol's order: the signed manifest, then the files, then each file's digest, then the gate.
    assert steps[steps.index("verifying"):] == ["verifying", "downloading", "verifying", "gating", "canary", "active"]
    assert second != first and len(second) == 1
    assert entry["version"] == "1.1.0" and entry["previous"] is None and entry["rejected"] == []
    assert entry["gate"]["passed"] and entry["gate"]["routes"]["activity"]["metric"] == "accuracy"
    assert entry["canary"]["answers"] >= 30
    canary = entry["canary"]  # 20 answers before the swap and 30 after: short of PSI's minimum, and it says so
    assert canary["psi"] is None and len(canary["not_judged"]) == 1, canary
    assert re.fullmatch(r"PSI of route 'activity': \d+ of 200 answers \(new release \d+, previous 20\)",
                        canary["not_judged"][0]), canary
    # The latency is judged whatever the traffic: the two releases' copies invoked in turn. 1.1.0 is
    # the activity model with a float32 interface: the same graph, with a quantize step of its own.
    assert 0.5 < canary["latency_ratio"] < 2 and canary["latency_invokes"] >= 100, canary
    assert (tmp_path / "gw1/store/activity/current").resolve().name == "2"


def test_each_fault_is_refused_with_its_code_and_the_old_model_serves(site, start_daemon, client, tmp_path):
    config = site.config(tmp_path / "gw1", fetch={"attempts": 1, "backoff_s": 0.05, "stall_s": 5})
    start_daemon(config, wait_online=client, client_id=NODE)
    client.subscribe(RESULTS)
    serving = answered_by(client, activity_payloads(10))
    faults = _faulty_releases(site)
    for rev, (code, serial, url, desired_serial) in enumerate(faults, start=1):
        desire(client, NODE, rev, url, desired_serial)
        doc = reported(client, NODE, lambda m, s=desired_serial: m["state"] == "failed" and m.get("error")
                       and any(r["serial"] == s for r in m["rejected"]))
        entry = doc["models"]["activity"]
        assert entry["error"]["code"] == code, (code, entry["error"])
        assert entry["serial"] is None  # nothing was committed
    assert answered_by(client, activity_payloads(10)) == serving
    model_paths = [p for p in site.server.requests if p.endswith("model.tflite")]
    assert not any(p.startswith(("/activity/13/", "/activity/14/")) for p in model_paths), model_paths


def _faulty_releases(site: Site) -> list[tuple[str, int, str, int]]:
    """(code, serial, url, serial the desired document names), one release broken in one way each."""
    stranger = minisign.generate()
    out = [("untrusted_key", 11, site.release(11, "1.1.1", key=stranger), 11)]
    url = site.release(12, "1.1.2")
    manifest = site.release_dir(12) / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"1.1.2"', '"1.1.9"'))
    out.append(("bad_signature", 12, url, 12))
    out.append(("interface", 13, site.release(13, "1.1.3", GUNPOINT), 13))  # gunpoint's model as activity
    out.append(("wrong_model", 14, site.release(14, "1.1.4", name="activity-x"), 14))
    url = site.release(15, "1.1.5")
    model = site.release_dir(15) / "model.tflite"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model.write_bytes(bytes(data))
    out.append(("sha256_mismatch", 15, url, 15))
    url = site.release(16, "1.1.6")
    model = site.release_dir(16) / "model.tflite"
    model.write_bytes(model.read_bytes()[:-100])
    out.append(("size_mismatch", 16, url, 16))
    out.append(("serial_mismatch", 17, site.release(17, "1.1.7"), 99))
    out.append(("gate", 18, site.release(18, "1.1.8", labels=permuted(ACTIVITY / "labels.txt")), 18))
    claim = claim_on(ACTIVITY / "test.npz", "accuracy", 0.5)
    out.append(("claim", 19, site.release(19, "1.1.9", claims=[claim]), 19))
    return out


def install(client: Client, rev: int, url: str, serial: int, traffic: int = 40) -> dict:
    """Desire `serial`, feed its canary, and the reported entry once it is active."""
    desire(client, NODE, rev, url, serial)
    reported(client, NODE, lambda m: m["state"] == "canary" and m["serial"] == serial)
    answered_by(client, activity_payloads(traffic))
    return reported(client, NODE, lambda m: m["state"] == "active" and m["serial"] == serial)["models"]["activity"]


def test_a_release_that_answers_differently_on_live_traffic_is_rolled_back(site, start_daemon, client, tmp_path):
    # No validate data: the gate cannot see the permuted labels, the canary must.
    config = site.config(tmp_path / "gw1", validate=False, canary={"duration_s": 2, "min_answers": 400})
    start_daemon(config, wait_online=client, client_id=NODE)
    client.subscribe(RESULTS)
    good = site.release(2, "1.1.0", ACTIVITY_FLOAT_IO)
    desire(client, NODE, 1, good, 2)
    reported(client, NODE, lambda m: m["state"] == "canary" and m["serial"] == 2)
    answered_by(client, activity_payloads(400))
    reported(client, NODE, lambda m: m["state"] == "active" and m["serial"] == 2)
    answered_by(client, skewed_payloads(250))  # the previous release's window, before the swap
    bad = site.release(3, "1.2.0", ACTIVITY_FLOAT_IO, labels=permuted(ACTIVITY / "labels.txt"))
    desire(client, NODE, 2, bad, 3)
    reported(client, NODE, lambda m: m["state"] == "canary" and m["serial"] == 3)
    answered_by(client, skewed_payloads(250, start=1000))
    entry = reported(client, NODE, lambda m: m["state"] == "rolled_back")["models"]["activity"]
    assert entry["serial"] == 2 and entry["error"]["code"] == "canary" and "PSI" in entry["error"]["message"]
    assert entry["rejected"][-1]["serial"] == 3
    before = len(client.on(RESULTS))
    answered_by(client, skewed_payloads(20, start=2000))
    labels = [json.loads(m.payload)["label"] for m in client.on(RESULTS)[before:]]
    assert set(labels) <= {"badminton", "running"} and len(labels) == 20  # serial 2's labels again
    assert (tmp_path / "gw1/store/activity/current").resolve().name == "2"


def test_a_replayed_retained_document_changes_nothing_and_rollback_needs_no_download(site, start_daemon, client,
                                                                                    tmp_path):
    config = site.config(tmp_path / "gw1")
    node = start_daemon(config, wait_online=client, client_id=NODE)
    client.subscribe(RESULTS)
    install(client, 1, site.release(2, "1.1.0", ACTIVITY_FLOAT_IO), 2)
    install(client, 2, site.release(3, "1.2.0"), 3)
    asked = len(site.server.requests)
    node.stop()
    client.messages.clear()
    start_daemon(config, wait_online=client, client_id=NODE)  # the broker replays the retained rev 2
    doc = reported(client, NODE, lambda m: m["state"] == "active")
    assert doc["models"]["activity"]["serial"] == 3 and doc["rev"] == {"node": 2}
    assert len(site.server.requests) == asked, site.server.requests[asked:]
    sha3 = answered_by(client, activity_payloads(10))
    client.c.publish(f"edge-inferd/{NODE}/fleet/cmd", json.dumps({"cmd": "rollback", "model": "activity"}), qos=1)
    entry = reported(client, NODE, lambda m: m["state"] == "rolled_back")["models"]["activity"]
    assert entry["serial"] == 2 and entry["error"]["code"] == "operator"
    assert answered_by(client, activity_payloads(10)) != sha3
    assert len(site.server.requests) == asked  # a kept release: nothing fetched


# One node per kill point, all three at once (each has its own store, topics and desired document).
KILLED_AT = {"gw1": "mid_admit", "gw2": "after_journal", "gw3": "after_current"}


def test_a_node_killed_at_a_step_of_the_swap_starts_on_one_whole_release(site, start_daemon, broker, client,
                                                                        tmp_path):
    from daemon.fleet.node.store import KILL_ENV
    from tests.integration.conftest import Daemon

    configs = {node: site.config(tmp_path / node, client_id=node) for node in KILLED_AT}
    for node in KILLED_AT:
        client.subscribe(f"edge-inferd/{node}/status")
    doomed = {node: Daemon(configs[node], broker.address, tmp_path / f"doomed-{node}.log", env={KILL_ENV: step})
              for node, step in KILLED_AT.items()}
    for node in KILLED_AT:
        client.wait_payload(f"edge-inferd/{node}/status", b"online")
    url = site.release(2, "1.1.0", ACTIVITY_FLOAT_IO)
    for node in KILLED_AT:
        desire(client, node, 1, url, 2)
    for node, step in KILLED_AT.items():
        assert doomed[node].proc.wait(60) == -signal.SIGKILL, (step, doomed[node].log()[-2000:])
        doomed[node].stop()
    client.messages.clear()
    for node in KILLED_AT:
        client.subscribe(f"edge-inferd/{node}/status")
        start_daemon(configs[node])
    for node in KILLED_AT:
        client.wait_payload(f"edge-inferd/{node}/status", b"online")
        client.subscribe(f"results/{node}/dev1/activity")
    for node, step in KILLED_AT.items():
        reported(client, node, lambda m: m["state"] in ("canary", "active") and m["serial"] == 2)
        answered_by(client, activity_payloads(40), node)
        entry = reported(client, node, lambda m: m["state"] == "active")["models"]["activity"]
        assert entry["serial"] == 2 and entry["rejected"] == [], (step, entry)
        store = tmp_path / node / "store/activity"
        assert not (store / "journal.json").exists() and (store / "current").resolve().name == "2", step


def test_a_release_the_daemon_keeps_restarting_on_is_reverted_at_start(site, start_daemon, client, tmp_path):
    config = site.config(tmp_path / "gw1", canary={"duration_s": 0, "min_answers": 10, "max_restarts": 1})
    node = start_daemon(config, wait_online=client, client_id=NODE)
    client.subscribe(RESULTS)
    install(client, 1, site.release(2, "1.1.0", ACTIVITY_FLOAT_IO), 2)
    node.stop()
    config.write_text(config.read_text().replace("duration_s: 0", "duration_s: 3600"))  # a canary that lasts
    client.messages.clear()
    node = start_daemon(config, wait_online=client, client_id=NODE)
    desire(client, NODE, 2, site.release(3, "1.2.0"), 3)
    reported(client, NODE, lambda m: m["state"] == "canary" and m["serial"] == 3)
    for _ in range(2):  # two crashes during the canary: one more than max_restarts
        node.stop(signal.SIGKILL)
        client.messages.clear()
        node = start_daemon(config, wait_online=client, client_id=NODE)
    entry = reported(client, NODE, lambda m: m["state"] == "rolled_back")["models"]["activity"]
    assert entry["serial"] == 2 and entry["error"]["code"] == "canary" and "started 2 times" in entry["error"]["message"]


def test_manual_activation_waits_staged_for_install(site, start_daemon, client, tmp_path):
    config = site.config(tmp_path / "gw1", activation="manual")
    start_daemon(config, wait_online=client, client_id=NODE)
    client.subscribe(RESULTS)
    serving = answered_by(client, activity_payloads(5))
    desire(client, NODE, 1, site.release(2, "1.1.0", ACTIVITY_FLOAT_IO), 2)
    entry = reported(client, NODE, lambda m: m["state"] == "staged")["models"]["activity"]
    assert entry["staged"] == 2 and entry["serial"] is None and entry["gate"]["passed"]
    assert answered_by(client, activity_payloads(5)) == serving
    client.c.publish(f"edge-inferd/{NODE}/fleet/cmd", json.dumps({"cmd": "install", "model": "activity"}), qos=1)
    reported(client, NODE, lambda m: m["state"] == "canary" and m["serial"] == 2)
    assert answered_by(client, activity_payloads(40)) != serving
    doc = reported(client, NODE, lambda m: m["state"] == "active")
    assert doc["last_cmd"]["ok"] and doc["last_cmd"]["cmd"] == "install"


def test_too_few_signatures_and_a_downgrade_are_refused(site, start_daemon, client, tmp_path):
    from daemon.fleet.controller.publish import add_signature

    second = minisign.generate()
    config = site.config(tmp_path / "gw1", threshold=2,
                         trusted_keys=[site.key.public_key.line, second.public_key.line])
    start_daemon(config, wait_online=client, client_id=NODE)
    client.subscribe(RESULTS)
    desire(client, NODE, 1, site.release(5, "1.5.0"), 5)
    entry = reported(client, NODE, lambda m: m["state"] == "failed")["models"]["activity"]
    assert entry["error"]["code"] == "too_few_signatures"
    add_signature(site.release_dir(5), second)
    client.c.publish(f"edge-inferd/{NODE}/fleet/cmd", json.dumps({"cmd": "retry", "model": "activity"}), qos=1)
    install(client, 2, site.server.url("activity/5/"), 5)
    url = site.release(4, "1.4.0", ACTIVITY_FLOAT_IO)
    add_signature(site.release_dir(4), second)
    desire(client, NODE, 3, url, 4)
    entry = reported(client, NODE, lambda m: m["state"] == "failed" and m["error"]["code"] == "downgrade")
    assert entry["models"]["activity"]["serial"] == 5


def test_a_full_disk_is_refused_before_the_download_and_the_old_model_serves(site, start_daemon, client, tmp_path):
    store = tmp_path / "small"
    store.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(store)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        config = site.config(tmp_path / "gw1", store_dir=str(store))  # fleet.fetch.min_free_mb: 64 by default
        start_daemon(config, wait_online=client, client_id=NODE)
        client.subscribe(RESULTS)
        serving = answered_by(client, activity_payloads(5))
        desire(client, NODE, 1, site.release(2, "1.1.0", ACTIVITY_FLOAT_IO), 2)
        entry = reported(client, NODE, lambda m: m["state"] == "failed")["models"]["activity"]
        assert entry["error"]["code"] == "no_space" and str(store) in entry["error"]["message"]
        assert answered_by(client, activity_payloads(5)) == serving
        assert not [p for p in site.server.requests if p.endswith("model.tflite")]
    finally:
        subprocess.run(["umount", "-l", str(store)], check=False)
