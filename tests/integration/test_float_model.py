"""A float model served as an INT8 one is (issue 36): the bundled activity model's float build
(models/activity/model_float.tflite) as a route's model and as the cascade's heavier tier, over a
real mosquitto, with the cache and batching on; `validate` and `bench model` on its route; and a
fleet release of it."""

from __future__ import annotations

import json

import numpy as np

from daemon import cli
from tests.integration.conftest import ROOT, activity_payloads, burst, write_config

FLOAT = ROOT / "models/activity/model_float.tflite"
LABELS = ROOT / "models/activity/labels.txt"
N = 40  # the activity model's test split


def _float_route_config(tmp_path, escalate: bool = False):
    models = {"activity_float": {"path": str(FLOAT), "labels": str(LABELS)}}
    if not escalate:
        return write_config(tmp_path, models={**models, "activity": {"path": str(FLOAT), "labels": str(LABELS)}})
    import yaml
    path = write_config(tmp_path, models=models)
    raw = yaml.safe_load(path.read_text())
    route = next(r for r in raw["routes"] if r["name"] == "activity")
    route["escalate"] = {"when": {"score_below": 1.01}, "to_model": "activity_float", "max_rate_per_s": 1000}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_a_float_model_serves_batched_and_cached_and_as_the_cascades_heavier_tier(tmp_path, client, start_daemon):
    daemon = start_daemon(_float_route_config(tmp_path, escalate=True), wait_online=client)
    client.subscribe("results/f/activity")
    with np.load(ROOT / "models/activity/test.npz") as data:
        y = data["y"]
    names = LABELS.read_text().split()
    burst(client, "sensors/f/imu", activity_payloads(N))  # queued together: batched
    first = {r["id"]: r for r in client.wait_json("results/f/activity", N)}
    for _ in range(2):  # the same windows again: admitted to the cache on a second sighting, then hits
        burst(client, "sensors/f/imu", activity_payloads(N))
    second = {r["id"]: r for r in client.wait_json("results/f/activity", 3 * N)[2 * N:]}
    assert all(r["tier"] == "local-large" for r in first.values())  # every one escalated (score_below 1.01)
    assert np.mean([names[y[i]] == first[i]["label"] for i in range(N)]) >= 0.95  # the float build's accuracy
    assert all(second[i]["cached"] and second[i]["label"] == first[i]["label"] for i in range(N)), [(r["cached"], r["tier"]) for r in second.values()][:5]
    daemon.stop()
    assert daemon.log().count("computes in float") == 1  # said once, at start-up


def test_validate_and_bench_model_run_a_float_route(tmp_path, capsys):
    config = _float_route_config(tmp_path)
    code = None
    try:
        cli.main(["validate", "--config", str(config), "--route", "activity", "--data",
                  str(ROOT / "models/activity/test.npz"), "--min-accuracy", "0.95"])
    except SystemExit as done:
        code = done.code
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code in (None, cli.EXIT_OK) and report["accuracy"] >= 0.95 and report["n"] == N
    try:
        cli.main(["bench", "model", "--config", str(config), "--route", "activity", "--batch", "1", "8",
                  "--iterations", "20", "--json"])
    except SystemExit as done:
        assert done.code in (None, cli.EXIT_OK)
    rows = json.loads(capsys.readouterr().out)
    assert {1, 8} <= {row["batch"] for row in rows} and all(row["p50_us"] > 0 for row in rows)


def test_a_float_model_is_released_and_its_manifest_describes_a_float_interface(tmp_path):
    from daemon.fleet.release import minisign
    from daemon.fleet.controller import publish
    from daemon.fleet.release.release import MANIFEST_NAME

    publish.make_release(tmp_path / "r", "activity", "1", 1, FLOAT, LABELS, minisign.generate())
    manifest = json.loads((tmp_path / "r" / MANIFEST_NAME).read_text())
    (spec,) = manifest["interface"]["inputs"]
    assert spec["dtype"] == "float32" and manifest["interface"]["quantized_tensors"] == 0
    # The node's gate measures it on the route's own data beside the running INT8 model.
    from daemon.config.loader import load_config
    from daemon.fleet.node.gate_check import report

    gated = report(load_config(write_config(tmp_path)), "activity", tmp_path / "r")
    figures = gated["activity"]
    assert figures["value"] >= 0.95 and figures["current"] >= 0.95, gated
