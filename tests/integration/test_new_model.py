"""A model that ships with nothing is served by config alone (tests/fixtures/digits)."""

from __future__ import annotations

import io
import json

import numpy as np

from daemon.config.loader import load_config
from daemon.pipeline.evaluate import predict
from daemon.pipeline.route_pipeline import route_pipeline
from daemon.model.runtime import Model
from tests.integration.conftest import ROOT, Client

FIXTURE = ROOT / "tests" / "fixtures" / "digits"


def test_unbundled_model_is_served_from_yaml_alone(client: Client, start_daemon):
    config = FIXTURE / "config.yaml"
    with np.load(FIXTURE / "test.npz") as data:
        x, y = data["x"][:120], data["y"][:120]
    loaded = load_config(config)
    model = Model(loaded.models["digits"].path)
    expected = predict(route_pipeline(loaded, loaded.routes[0], model), model, x)  # validate's path
    start_daemon(config, wait_online=client, client_id="edge-inferd-digits")
    client.subscribe("results/cam7/digit")

    for i, image in enumerate(x):
        buf = io.BytesIO()
        np.save(buf, image.astype(np.float32))
        client.publish("cameras/cam7/digit/front", buf.getvalue(), correlation=str(i).encode())
        if i % 16 == 15:
            client.wait_count("results/cam7/digit", i + 1)

    msgs = client.wait_count("results/cam7/digit", len(x))
    labels = {int(m.properties.CorrelationData): json.loads(m.payload)["label"] for m in msgs}
    assert sorted(labels) == list(range(len(x)))
    assert [labels[i] for i in range(len(x))] == [str(i) for i in expected]  # same answer, sample by sample
    assert np.mean(expected == y) >= 0.95
