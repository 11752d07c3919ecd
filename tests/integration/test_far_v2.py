"""The cascade's far tier on real v2 servers (`escalate.to_v2`): MLServer 1.7.1 and KServe 0.21.0
serving appliance_large (tests/integration/v2_servers.py), a real mosquitto and the daemon.

The unsure requests are answered by the far model exactly as the daemon's own runtime answers
them with that model (JSON to MLServer, the binary tensor extension to KServe); the server is
killed mid-stream and every request is still answered exactly once, none later than
timeout_ms after the server went. The scikit-learn case of docs/http.md runs as written there,
on MLServer's own sklearn runtime.
"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest
import yaml

from tests.integration import v2_servers
from tests.integration.conftest import ROOT, Client, TimedClient, write_config

THRESHOLD = 0.65  # config.yaml's commented cascade on the appliance route
TIMEOUT_MS = 800
ANSWER_TIMEOUT_MS = 10_000  # where the answers themselves are checked: a burst on 2 shared cores is slow
SLACK_S = 0.15
N_STREAM = 40
KILL_AT = 16
# Between requests: a stream well within the far tier's pace (appliance_large costs ~80 ms a row
# on a loaded 2-core machine, with two calls in flight).
GAP_S = 0.1


def _config(tmp_path, server: v2_servers.V2Server, score_below: float, timeout_ms: float = TIMEOUT_MS, **tier):
    card = json.loads((ROOT / "models/appliance_large/card.json").read_text())
    raw = yaml.safe_load((ROOT / "config.yaml").read_text())
    route = next(r for r in raw["routes"] if r["name"] == "appliance")
    route.pop("validate", None)
    binary = server.kind == v2_servers.KSERVE  # MLServer speaks JSON only over REST
    route["escalate"] = {"when": {"score_below": score_below}, "preprocess": card["preprocessing"],
                         "max_rate_per_s": 1000, "timeout_ms": timeout_ms,
                         "to_v2": {"url": server.url, "model": server.model, "output": "scores", "binary": binary,
                                   **tier}}
    models = {"appliance": {"path": str(ROOT / "models/appliance/model.tflite"),
                            "labels": str(ROOT / "models/appliance/labels.txt")}}
    return write_config(tmp_path, routes=[route], models=models, cache={"enabled": False})


def _traces(n: int) -> np.ndarray:
    with np.load(ROOT / "models/appliance/test.npz") as data:
        return data["x"][np.linspace(0, len(data["x"]) - 1, n).astype(int)].astype(np.float32)


def test_the_unsure_are_answered_by_the_far_model_as_the_daemon_would(tmp_path, broker, start_daemon, v2_server):
    x = _traces(30)
    client = Client(broker)
    try:
        start_daemon(_config(tmp_path, v2_server, THRESHOLD, ANSWER_TIMEOUT_MS), wait_online=client)
        client.subscribe("results/+/appliance")
        for i, row in enumerate(x):
            client.publish("plugs/p1/power", json.dumps({"id": i, "data": row.tolist()}).encode())
        replies = {r["id"]: r for r in client.wait_json("results/p1/appliance", len(x))}
    finally:
        client.close()
    card = json.loads((ROOT / "models/appliance_large/card.json").read_text())
    from daemon.model import preprocess
    steps = [preprocess.parse_step(s) for s in card["preprocessing"]]
    large = v2_servers.daemon_scores(preprocess.apply_steps(steps, x))
    labels = (ROOT / "models/appliance/labels.txt").read_text().split()
    tiers = [replies[i]["tier"] for i in range(len(x))]
    assert "local" in tiers and "remote" in tiers, tiers
    for i, r in replies.items():
        if r["tier"] == "remote":
            assert r["model"] == "appliance_large" and r["index"] == int(large[i].argmax())
            assert r["label"] == labels[r["index"]] and abs(r["score"] - float(large[i].max())) < 1e-5
            assert "escalation" not in r
        else:
            assert r["model"] == "appliance" and r["score"] >= THRESHOLD and "escalation" not in r, json.dumps(r)


def test_server_killed_mid_stream_every_request_answered_once_in_time(tmp_path, broker, start_daemon, v2_server):
    x = _traces(N_STREAM)
    client = TimedClient(broker)
    try:
        start_daemon(_config(tmp_path, v2_server, 1.01, breaker={"failures": 2, "open_s": 60}),
                     wait_online=client)
        client.subscribe("results/+/appliance")
        sent, killed_at = {}, None
        for i in range(N_STREAM):
            if i == KILL_AT:  # mid-stream: some requests are at the far tier right now
                v2_server.kill(signal.SIGKILL)
                killed_at = time.monotonic()
            sent[i] = time.monotonic()
            client.publish("plugs/p1/power", json.dumps({"id": i, "data": x[i].tolist()}).encode())
            time.sleep(GAP_S)
        client.wait_count("results/p1/appliance", N_STREAM)
        time.sleep(TIMEOUT_MS / 1000 + 0.5)  # room for a duplicate to show up
        replies = [json.loads(m.payload) for m in client.on("results/p1/appliance")]
    finally:
        client.close()
    assert sorted(r["id"] for r in replies) == list(range(N_STREAM))  # each exactly once
    by_id = {r["id"]: r for r in replies}
    before = [by_id[i]["tier"] for i in range(KILL_AT)]
    assert before.count("remote") >= KILL_AT // 2, before  # the far tier answered while it was there
    assert all(r["tier"] == "local" and r["escalation"] in ("error", "timeout") for r in replies if r["tier"] != "remote")
    after = [by_id[i] for i in range(KILL_AT, N_STREAM)]
    assert all(r["tier"] == "local" for r in after)
    assert sum(r["escalation"] == "error" for r in after) >= len(after) - 2, after  # refused, then the breaker
    late = {i: client.arrived[i][0] - max(sent[i], killed_at) for i in range(N_STREAM)}
    assert max(late.values()) <= TIMEOUT_MS / 1000 + SLACK_S, late


@pytest.mark.parametrize("tier, why", [({"output": "nope"}, "no output 'nope'"),
                                       ({"model": "not-served"}, "404")])
def test_a_misconfigured_far_tier_costs_the_local_answer_only(tmp_path, broker, start_daemon, mlserver_v2, tier, why):
    x = _traces(5)
    client = Client(broker)
    try:
        start_daemon(_config(tmp_path, mlserver_v2, 1.01, **tier), wait_online=client)
        client.subscribe("results/+/appliance")
        for i, row in enumerate(x):
            client.publish("plugs/p1/power", json.dumps({"id": i, "data": row.tolist()}).encode())
        replies = client.wait_json("results/p1/appliance", len(x))
    finally:
        client.close()
    assert sorted(r["id"] for r in replies) == list(range(len(x)))
    assert all(r["tier"] == "local" and r["escalation"] == "error" and r["model"] == "appliance" for r in replies), why


# --- docs/http.md, "A scikit-learn model on MLServer": its three blocks, run as they stand ---

DOC = ROOT / "docs" / "http.md"
SKLEARN_SECTION = "### A scikit-learn model on MLServer"
SKLEARN_N = 20
FIT_TIMEOUT_S = 120.0
# Runs the doc's fitting snippet with the MLServer venv's Python (its scikit-learn), then scores
# the far rows the gateway sends with the model it wrote: what scikit-learn itself answers.
FIT_AND_SCORE = """
import runpy, sys
import joblib, numpy as np
runpy.run_path(sys.argv[1], run_name="__main__")
model = joblib.load("appliance-sklearn/model.joblib")
np.save("expected.npy", model.predict_proba(np.load("rows.npy")))
"""


def _doc_blocks(heading: str) -> dict[str, str]:
    """The code blocks of one docs/http.md section by language: python, json and yaml, one each."""
    text = DOC.read_text()
    start = text.index(heading)
    ends = [i for i in (text.find("\n## ", start + 1), text.find("\n### ", start + 1)) if i != -1]
    blocks = re.findall(r"```(\w+)\n(.*?)```", text[start:min(ends, default=len(text))], re.S)
    assert sorted(lang for lang, _ in blocks) == ["json", "python", "yaml"], blocks
    return dict(blocks)


def _fit_as_documented(tmp_path, snippet: str, rows: np.ndarray) -> tuple:
    """The doc's snippet run from a folder laid out as the repository root: the model folder it
    wrote, and scikit-learn's own scores for `rows`."""
    fit = tmp_path / "fit"
    fit.mkdir()
    (fit / "models").symlink_to(ROOT / "models")
    (fit / "fit_far_model.py").write_text(snippet)
    np.save(fit / "rows.npy", rows)
    proc = subprocess.run([str(v2_servers.python_of(v2_servers.MLSERVER)), "-c", FIT_AND_SCORE, "fit_far_model.py"],
                          cwd=fit, capture_output=True, text=True, timeout=FIT_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return fit / "appliance-sklearn", np.load(fit / "expected.npy")


def _infer(server: v2_servers.V2Server, rows: np.ndarray, outputs=None) -> tuple[int, str, bytes]:
    body = {"inputs": [{"name": "input", "shape": list(rows.shape), "datatype": "FP32",
                        "data": rows.ravel().tolist()}]}
    if outputs is not None:
        body["outputs"] = [{"name": name} for name in outputs]
    conn = http.client.HTTPConnection(v2_servers.LOOPBACK, server.port, timeout=ANSWER_TIMEOUT_MS / 1000)
    try:
        conn.request("POST", f"/v2/models/{server.model}/infer", json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type", ""), response.read()
    finally:
        conn.close()


def _the_docs_warnings_hold(server: v2_servers.V2Server, route: dict, flat: np.ndarray, x: np.ndarray) -> None:
    """Rows in the route's own layout ([292, 1]) are a plain-text 500; without `predict_proba`
    named, the runtime answers `predict`: one class index per row."""
    from daemon.model import preprocess
    layered = preprocess.apply_steps([preprocess.parse_step(s) for s in route["preprocess"]], x[:2])
    assert layered.shape == (2, 292, 1)
    status, content_type, body = _infer(server, layered)
    assert status == 500 and content_type.startswith("text/plain"), (status, body[:300])
    status, _, body = _infer(server, flat[:2])
    (output,) = json.loads(body)["outputs"]
    assert status == 200 and output["name"] == "predict" and output["shape"] == [2, 1], output


def test_the_docs_sklearn_far_tier_runs_as_written(tmp_path, broker, start_daemon):
    reason = v2_servers.sklearn_available()
    if reason is not None:
        pytest.skip(reason)
    from daemon.model import preprocess
    blocks = _doc_blocks(SKLEARN_SECTION)
    escalate = yaml.safe_load(blocks["yaml"])["routes"][0]["escalate"]
    x = _traces(SKLEARN_N)
    rows = preprocess.apply_steps([preprocess.parse_step(s) for s in escalate["preprocess"]], x)
    model_dir, expected = _fit_as_documented(tmp_path, blocks["python"], rows)
    settings = json.loads(blocks["json"])
    server = v2_servers.V2Server(v2_servers.MLSERVER, tmp_path / "server", model=settings["name"])
    shutil.move(model_dir, server.dir / settings["name"])
    (server.dir / settings["name"] / "model-settings.json").write_text(blocks["json"])
    raw = yaml.safe_load((ROOT / "config.yaml").read_text())
    route = next(r for r in raw["routes"] if r["name"] == "appliance")
    route.pop("validate", None)
    # Only the address and, on a loaded 2-core machine, the deadline differ from the doc's.
    route["escalate"] = {**escalate, "timeout_ms": ANSWER_TIMEOUT_MS,
                         "to_v2": {**escalate["to_v2"], "url": server.url}}
    models = {"appliance": {"path": str(ROOT / "models/appliance/model.tflite"),
                            "labels": str(ROOT / "models/appliance/labels.txt")}}
    client = Client(broker)
    try:
        start_daemon(write_config(tmp_path, routes=[route], models=models, cache={"enabled": False}))
        server.start()  # while the daemon starts: it calls the server only once requests come
        _the_docs_warnings_hold(server, route, rows, x)
        client.subscribe("edge-inferd/edge-inferd/status")
        client.wait_payload("edge-inferd/edge-inferd/status", b"online")
        client.subscribe("results/+/appliance")
        for i, row in enumerate(x):
            client.publish("plugs/p1/power", json.dumps({"id": i, "data": row.tolist()}).encode())
        replies = {r["id"]: r for r in client.wait_json("results/p1/appliance", len(x))}
    finally:
        client.close()
        server.kill(signal.SIGTERM)
    tiers = [replies[i]["tier"] for i in range(len(x))]
    assert "remote" in tiers and "local" in tiers, tiers
    for i, r in replies.items():
        if r["tier"] == "remote":
            assert r["model"] == settings["name"] and "escalation" not in r, r
            assert r["index"] == int(expected[i].argmax()) and abs(r["score"] - float(expected[i].max())) < 1e-5, r
        else:
            assert r["score"] >= escalate["when"]["score_below"] and "escalation" not in r, r
