"""The bundled autoencoder through config.yaml's `load` (anomaly) and `load-profile` (values) routes."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from daemon.config.loader import load_config
from daemon.model.runtime import Model
from daemon.pipeline.evaluate import Gate, validate
from daemon.pipeline.request_path import handle
from daemon.pipeline.route_pipeline import route_pipeline

ROOT = Path(__file__).resolve().parents[2]
CARD = json.loads((ROOT / "models/load_anomaly/card.json").read_text())


@pytest.fixture(scope="module")
def setup():
    config = load_config(ROOT / "config.yaml")
    model = Model(config.models["load_anomaly"].path)
    with np.load(ROOT / "models/load_anomaly/test.npz") as data:
        return config, model, data["x"], data["y"]


def _route(config, name: str):
    return next(r for r in config.routes if r.name == name)


def _reply(pipe, model, day: np.ndarray) -> dict:
    payload = json.dumps({"id": 1, "data": day.tolist()}).encode()
    return handle(pipe, payload, model, None, time.monotonic(), time.monotonic)


def test_an_anomaly_reply_is_the_reconstruction_error_of_the_standardized_day(setup):
    config, model, x, y = setup
    day, route = x[0], _route(config, "load")
    reply = _reply(route_pipeline(config, route, model), model, day)
    z = (day - day.mean()) / max(day.std(), 1e-6)
    expected = float(np.mean((z - model.infer(z[None].astype(np.float32))[0]) ** 2))
    assert reply["anomaly_score"] == pytest.approx(expected, abs=1e-6)
    assert reply["anomaly"] == (expected > route.threshold) and reply["threshold"] == route.threshold
    assert {"id", "route", "model", "model_sha256", "cached", "latency_ms"} <= set(reply) and "label" not in reply


def test_the_threshold_flags_anomalous_days_far_more_often_than_normal_ones(setup):
    config, model, x, y = setup
    pipe = route_pipeline(config, _route(config, "load"), model)
    flagged = np.array([_reply(pipe, model, day)["anomaly"] for day in x[:200]])
    normal, anomalous = flagged[y[:200] == 0].mean(), flagged[y[:200] == 1].mean()
    assert normal < 0.1 and anomalous > 0.8  # the card: 4.9 % and 89.5 % on the whole split


def test_validate_reproduces_the_cards_roc_auc_and_threshold(setup):
    config, *_ = setup
    report, ok = validate(config, "load", ROOT / "models/load_anomaly/test.npz", gate=Gate(min_roc_auc=0.95))
    assert ok and report["roc_auc"] == pytest.approx(CARD["int8_roc_auc"], abs=1e-4)
    assert report["threshold"] == pytest.approx(CARD["threshold_at_5pct_fpr"]["int8"]["threshold"], abs=1e-5)
    assert not validate(config, "load", ROOT / "models/load_anomaly/test.npz", gate=Gate(min_roc_auc=0.99))[1]


def test_a_values_reply_carries_every_output_by_name(setup, tmp_path):
    config, model, x, _ = setup
    reply = _reply(route_pipeline(config, _route(config, "load-profile"), model), model, x[3])
    (name,) = reply["values"]
    assert name == model.output.name and len(reply["values"][name]) == 24
    z = (x[3] - x[3].mean()) / max(x[3].std(), 1e-6)
    assert reply["values"][name] == pytest.approx(model.infer(z[None].astype(np.float32))[0].tolist(), abs=1e-6)
    data = tmp_path / "targets.npz"  # the day itself is the target of a reconstruction: MAE and RMSE
    zs = (x - x.mean(axis=1, keepdims=True)) / np.maximum(x.std(axis=1, keepdims=True), 1e-6)
    np.savez(data, x=x[:100], y=zs[:100])
    report, ok = validate(config, "load-profile", data, gate=Gate(max_mae=1.0))
    assert ok and 0 < report["mae"] <= report["rmse"] and report["n"] == 100
    assert not validate(config, "load-profile", data, gate=Gate(max_mae=report["mae"] / 2))[1]
