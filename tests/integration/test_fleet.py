"""Fleet delivery on a real node: a real daemon, mosquitto, an HTTP release server, signed releases.

Each fault leaves the old model serving and says why in the retained reported document
(docs/fleet.md). The releases are the bundled activity model and a second build of it with a
float32 interface (another sha256, the same answers), signed by `fleet sign`'s own code.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from daemon.fleet import minisign
from tests.integration.conftest import ROOT, Client, activity_payloads, burst
from tests.integration.fleet_site import (ACTIVITY, ACTIVITY_FLOAT_IO, GUNPOINT, Site, claim_on, desire, permuted,
                                          reported)

pytestmark = pytest.mark.integration
NODE = "gw1"
REQUESTS = f"sensors/{NODE}/dev1/imu"
RESULTS = f"results/{NODE}/dev1/activity"


@pytest.fixture
def site(tmp_path):
    s = Site(tmp_path)
    yield s
    s.close()


def answered_by(client: Client, payloads: list[bytes]) -> set:
    """Send `payloads` (distinct ids) and the set of model_sha256 that answered them."""
    before = len(client.on(RESULTS))
    burst(client, REQUESTS, payloads)
    replies = [json.loads(m.payload) for m in client.wait_count(RESULTS, before + len(payloads))[before:]]
    assert all("error" not in r for r in replies), replies[:3]
    return {r["model_sha256"] for r in replies}


def test_a_release_goes_from_desired_to_active_and_serves(site, start_daemon, client, tmp_path):
    config = site.config(tmp_path / "gw1")
    start_daemon(config, wait_online=client, client_id=NODE)
    client.subscribe(RESULTS)
    first = answered_by(client, activity_payloads(20))
    url = site.release(2, "1.1.0", ACTIVITY_FLOAT_IO, summary="float interface build")
    started = time.monotonic()
    desire(client, NODE, 1, url, 2)
    reported(client, NODE, lambda m: m["state"] == "canary" and m["serial"] == 2)
    second = answered_by(client, activity_payloads(60))  # the canary's answers
    doc = reported(client, NODE, lambda m: m["state"] == "active" and m["serial"] == 2)
    print(f"desired -> active: {time.monotonic() - started:.2f} s")
    entry = doc["models"]["activity"]
    assert second != first and len(second) == 1
    assert entry["version"] == "1.1.0" and entry["previous"] is None and entry["rejected"] == []
    assert entry["gate"]["passed"] and entry["gate"]["routes"]["activity"]["metric"] == "accuracy"
    assert entry["canary"]["answers"] >= 30
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
