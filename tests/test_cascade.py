"""The confidence cascade (`escalate:`): config rules, and `to_model` through the real dispatcher.

The two tiers are real interpreters: the bundled activity model, served a second time under
another name (`activity_large`), so the test knows every score in advance.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from daemon.cascade import TokenBucket
from daemon.config import WorkersConfig, load_config
from daemon.dispatch import Dispatcher
from daemon.errors import ConfigError
from daemon.evaluate import route_pipeline
from daemon.pipeline import handle
from daemon.runtime import Model
from daemon.stats import Stats
from tests.test_dispatch import Recorder, _inbound

ROOT = Path(__file__).resolve().parents[1]
N = 20


def _write_config(tmp_path: Path, escalate, route_edit=None) -> Path:
    raw = yaml.safe_load((ROOT / "config.yaml").read_text())
    raw["models"] = {name: {"path": str(ROOT / f"models/{src}/model.tflite"),
                            "labels": str(ROOT / f"models/{src}/labels.txt")}
                     for name, src in (("activity", "activity"), ("activity_large", "activity"),
                                       ("appliance", "appliance"))}
    route = raw["routes"][0]
    route.pop("validate", None)
    route["escalate"] = escalate
    route.update(route_edit or {})
    raw["routes"] = [route]
    raw["mqtt"].pop("outbox", None)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _errors(tmp_path, escalate, route_edit=None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(_write_config(tmp_path, escalate, route_edit))
    return "\n".join(info.value.errors)


def test_escalate_is_read_with_its_defaults(tmp_path):
    config = load_config(_write_config(tmp_path, {"when": {"score_below": 0.6}, "to_model": "activity_large"}))
    esc = config.routes[0].escalate
    assert (esc.score_below, esc.margin_below, esc.to_model, esc.to_topic) == (0.6, None, "activity_large", None)
    assert (esc.timeout_ms, esc.max_rate_per_s) == (500.0, 20.0)
    assert esc.wants([0.5, 0.3]) and not esc.wants([0.7, 0.2])
    margin = load_config(_write_config(tmp_path, {"when": {"margin_below": 0.2}, "to_topic": "gpu/{1}/x"})).routes[0]
    assert margin.escalate.wants([0.5, 0.4]) and not margin.escalate.wants([0.5, 0.2])


@pytest.mark.parametrize("escalate, route_edit, message", [
    ({"when": {"score_below": 0.6}}, None, "routes[0].escalate: needs exactly one of to_model, to_topic"),
    ({"when": {"score_below": 0.6}, "to_model": "activity_large", "to_topic": "a/b"}, None,
     "needs exactly one of to_model, to_topic"),
    ({"when": {}, "to_model": "activity_large"}, None, "routes[0].escalate.when: needs exactly one of"),
    ({"when": {"score_below": 0.6, "margin_below": 0.1}, "to_model": "activity_large"}, None, "exactly one of"),
    ({"when": {"score_below": 0.6}, "to_model": "nope"}, None,
     "routes[0].escalate.to_model: unknown model 'nope'"),
    ({"when": {"score_below": 0.6}, "to_topic": "gpu/{2}/x"}, None,
     "routes[0].escalate.to_topic: placeholder {2} but the subscribe filter has only 1"),
    ({"when": {"score_below": 0.6}, "to_model": "appliance"}, None,
     "routes[0].escalate.to_model: model 'appliance' takes [292, 1]"),
    ({"when": {"margin_below": 0.2}, "to_model": "activity_large"}, {"output": {"top_k": 1}},
     "margin_below needs output.top_k of at least 2"),
    ({"when": {"score_below": 0.6}, "to_model": "activity_large", "timeout_ms": 0}, None,
     "routes[0].escalate.timeout_ms"),
    ({"when": {"score_below": 0.6}, "to_model": "activity_large", "bogus": 1}, None, "bogus"),
])
def test_escalate_mistakes_are_reported_by_key_path(tmp_path, escalate, route_edit, message):
    assert message in _errors(tmp_path, escalate, route_edit)


def _requests() -> list[bytes]:
    with np.load(ROOT / "models/activity/test.npz") as data:
        x = data["x"][:N]
    rng = np.random.default_rng(0)  # noise, so that some results are unsure
    x = x + rng.normal(0, 3.0, x.shape).astype(np.float32)
    return [json.dumps({"id": i, "data": row.tolist()}).encode() for i, row in enumerate(x)]


def _serve(config_path: Path, payloads: list[bytes]) -> list[dict]:
    """Every payload through a one-worker dispatcher with the service's pipelines; replies by id."""
    config = load_config(config_path)
    route = config.routes[0]
    models = {name: Model(config.models[name].path) for name in ("activity", "activity_large")}
    pipe = route_pipeline(config, route, models["activity"])
    if route.escalate.to_model:
        large_route = dataclasses.replace(route, model=route.escalate.to_model, escalate=None)
        pipe = dataclasses.replace(pipe, escalate_to=route_pipeline(config, large_route, models["activity_large"]))
    d = Dispatcher([pipe], None, Stats(), WorkersConfig(max=1), lambda i: models)
    rec = Recorder()
    d.attach(rec)
    d.start()
    for i, payload in enumerate(payloads):
        d.on_message(_inbound("sensors/w1/imu", payload, i + 1))
    rec.wait(len(payloads))
    assert d.stop(30)
    assert sorted(rec.acked) == list(range(1, len(payloads) + 1))  # each acked once, after its reply
    assert len(rec.published) == len(payloads)
    return [r for _, r in sorted((r["id"], r) for _, r, _ in rec.published)]


def _local_scores(payloads) -> list[float]:
    config = load_config(ROOT / "config.yaml")
    model = Model(config.models["activity"].path)
    pipe = route_pipeline(config, config.routes[0], model)
    return [handle(pipe, p, model, None, time.monotonic(), time.monotonic)["score"] for p in payloads]


def test_to_model_escalates_exactly_the_low_confidence_requests_and_labels_the_tier(tmp_path):
    payloads = _requests()
    scores = _local_scores(payloads)
    threshold = float(np.median(scores))
    low = {i for i, s in enumerate(scores) if s < threshold}
    assert 0 < len(low) < N
    replies = _serve(_write_config(tmp_path, {"when": {"score_below": threshold}, "to_model": "activity_large",
                                              "max_rate_per_s": 1000}), payloads)
    assert {r["id"] for r in replies if r["tier"] == "local-large"} == low
    for r in replies:
        large = r["id"] in low
        assert r["tier"] == ("local-large" if large else "local") and "escalation" not in r
        assert r["model"] == ("activity_large" if large else "activity")


def test_rate_cap_keeps_the_local_answer_and_says_so(tmp_path):
    payloads = _requests()
    replies = _serve(_write_config(tmp_path, {"when": {"score_below": 1.01}, "to_model": "activity_large",
                                              "max_rate_per_s": 0.001}), payloads)
    tiers = [r["tier"] for r in replies]
    assert tiers.count("local-large") == 1  # the bucket holds one token; it refills in 1000 s
    assert all(r.get("escalation") == "rate_limited" for r in replies if r["tier"] == "local")


def test_token_bucket_refills_at_its_rate():
    now = [0.0]
    bucket = TokenBucket(2.0, lambda: now[0])
    assert [bucket.take() for _ in range(3)] == [True, True, False]
    now[0] = 0.5
    assert bucket.take() and not bucket.take()
