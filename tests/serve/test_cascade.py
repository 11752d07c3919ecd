"""The confidence cascade (`escalate:`): config rules, and `to_model` through the real serving parts (daemon/serve/wiring.py).

The two tiers are real interpreters: the bundled activity model, served a second time under
another name (`activity_large`), so the test knows every score in advance.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from daemon.pipeline import request_path
from daemon.pipeline.route_pipeline import Request
from daemon.serve.cascade import Cascade, RemoteCascade, TokenBucket
from daemon.config.schema import WorkersConfig
from daemon.config.loader import load_config
from daemon.serve import wiring
from daemon.errors import ConfigError
from daemon.pipeline.route_pipeline import route_pipeline
from daemon.transport.inbound import Inbound
from daemon.pipeline.request_path import handle
from daemon.model.runtime import Model
from daemon.obs.stats import Stats
from tests.serve.test_serving import Recorder, _inbound

ROOT = Path(__file__).resolve().parents[2]
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
    ({"when": {"score_below": 0.6}}, None, "routes[0].escalate: needs exactly one of to_model, to_topic, to_v2"),
    ({"when": {"score_below": 0.6}, "to_model": "activity_large", "to_topic": "a/b"}, None,
     "needs exactly one of to_model, to_topic, to_v2"),
    ({"when": {"score_below": 0.6}, "to_topic": "a/b", "to_v2": {"url": "http://h:1", "model": "m"}}, None,
     "needs exactly one of to_model, to_topic, to_v2"),
    ({"when": {"score_below": 0.6}, "to_v2": {"model": "m"}}, None, "routes[0].escalate.to_v2.url: is required"),
    ({"when": {"score_below": 0.6}, "to_v2": {"url": "ftp://h/x", "model": "m"}}, None,
     "routes[0].escalate.to_v2.url: must be an http:// or https:// URL"),
    ({"when": {"score_below": 0.6}, "to_v2": {"url": "http://h:99999", "model": "m"}}, None,
     "routes[0].escalate.to_v2.url: Port out of range"),
    ({"when": {"score_below": 0.6}, "to_v2": {"url": "http://h", "model": "a/b"}}, None,
     "routes[0].escalate.to_v2.model: must be a model name"),
    ({"when": {"score_below": 0.6}, "to_v2": {"url": "http://h", "model": "m", "input": {"datatype": "INT8"}}},
     None, "routes[0].escalate.to_v2.input.datatype"),
    ({"when": {"score_below": 0.6}, "to_v2": {"url": "http://h", "model": "m",
                                              "headers": {"Authorization": "Bearer x"}}},
     None, "routes[0].escalate.to_v2.headers.Authorization: is set by the daemon"),
    ({"when": {"score_below": 0.6}, "to_v2": {"url": "http://h", "model": "m", "headers": {"Host": "a\nb"}}},
     None, "routes[0].escalate.to_v2.headers.Host: must be a header name mapped to a one-line string"),
    ({"when": {"score_below": 0.6}, "to_v2": {"url": "http://h", "model": "m", "token_file": "nope.token"}},
     None, "routes[0].escalate.to_v2.token_file: cannot read"),
    ({"when": {"score_below": 0.6}, "to_v2": {"url": "https://h", "model": "m", "ca_file": "nope.pem"}},
     None, "routes[0].escalate.to_v2.ca_file:"),
    ({"when": {"score_below": 0.6}, "to_v2": {"url": "http://h", "model": "m", "batch": 0}},
     None, "routes[0].escalate.to_v2.batch"),
    ({"when": {"score_below": 0.6}, "to_v2": {"url": "http://h", "model": "m", "breaker": {"failures": 0}}},
     None, "routes[0].escalate.to_v2.breaker.failures"),
    ({"when": {"score_below": 0.6}, "to_v2": {"url": "http://h", "model": "m", "bogus": 1}},
     None, "routes[0].escalate.to_v2.bogus: unknown key"),
    ({"when": {"score_below": 0.6}, "to_v2": {"url": "http://h", "model": "m"},
      "preprocess": [{"reshape": {"shape": [7]}}]},
     None, "routes[0].escalate.preprocess: step 0 (reshape): cannot reshape [100, 6] to [7]"),
    ({"when": {}, "to_model": "activity_large"}, None, "routes[0].escalate.when: needs exactly one of"),
    ({"when": {"score_below": 0.6, "margin_below": 0.1}, "to_model": "activity_large"}, None, "exactly one of"),
    ({"when": {"score_below": 0.6}, "to_model": "nope"}, None,
     "routes[0].escalate.to_model: unknown model 'nope'"),
    ({"when": {"score_below": 0.6}, "to_topic": "gpu/{2}/x"}, None,
     "routes[0].escalate.to_topic: placeholder {2} but the subscribe filter has only 1"),
    ({"when": {"score_below": 0.6}, "to_model": "appliance"}, None,
     "routes[0].escalate.to_model: model 'appliance' takes [292, 1]"),
    ({"when": {"score_below": 0.6}, "to_model": "activity_large", "preprocess": [{"reshape": {"shape": [600]}}]},
     None, "model 'activity_large' takes [50, 6], but the route's input becomes [600] after escalate.preprocess"),
    ({"when": {"score_below": 0.6}, "to_model": "activity_large", "preprocess": [{"reshape": {"shape": [7]}}]},
     None, "routes[0].escalate.preprocess: step 0 (reshape): cannot reshape [100, 6] to [7]"),
    ({"when": {"score_below": 0.6}, "to_model": "activity_large", "preprocess": [{"bogus_step": {}}]},
     None, "routes[0].escalate.preprocess[0]"),
    ({"when": {"score_below": 0.6}, "to_topic": "gpu/{1}/x", "preprocess": []}, None,
     "routes[0].escalate.preprocess: applies to to_model and to_v2"),
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
    """Every payload through a one-worker serving with the service's pipelines; replies by id."""
    config = load_config(config_path)
    route = config.routes[0]
    models = {name: Model(config.models[name].path) for name in ("activity", "activity_large")}
    pipe = route_pipeline(config, route, models["activity"])
    if route.escalate.to_model:
        large_route = route.escalate.large_route(route)
        pipe = dataclasses.replace(pipe, escalate_to=route_pipeline(config, large_route, models["activity_large"]))
    d = wiring.build([pipe], None, Stats(), WorkersConfig(max=1), lambda i: models)
    rec = Recorder()
    d.attach(rec)
    d.start()
    for i, payload in enumerate(payloads):
        d.intake.on_message(_inbound("sensors/w1/imu", payload, i + 1))
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


def test_to_model_runs_on_its_own_escalate_preprocess(tmp_path):
    """`escalate.preprocess` replaces the route's steps for the heavier model only: here the large
    tier skips the route's normalize, so its answers are those of the model on the merely
    downsampled input, and the local tier's stay those of the route's pipeline."""
    payloads = _requests()
    own = [{"downsample": {"factor": 2, "axis": 0}}]
    replies = _serve(_write_config(tmp_path, {"when": {"score_below": 1.01}, "to_model": "activity_large",
                                              "preprocess": own, "max_rate_per_s": 1000}), payloads)
    model = Model(ROOT / "models/activity/model.tflite")
    x = np.array([json.loads(p)["data"] for p in payloads], dtype=np.float32)
    expected = model.infer(x.reshape(len(x), 50, 2, 6).mean(axis=2))
    assert all(r["tier"] == "local-large" for r in replies)
    assert [r["index"] for r in replies] == [int(i) for i in expected.argmax(axis=1)]
    assert [r["score"] for r in replies] == pytest.approx([float(s) for s in expected.max(axis=1)], abs=1e-6)
    assert [r["index"] for r in replies] != [int(np.argmax(s)) for s in _local_scores_full(payloads)]


def _local_scores_full(payloads) -> list:
    config = load_config(ROOT / "config.yaml")
    model = Model(config.models["activity"].path)
    return [model.infer(route_pipeline(config, config.routes[0], model).preprocess(
        np.array([json.loads(p)["data"]], dtype=np.float32)))[0] for p in payloads]


def test_rate_cap_keeps_the_local_answer_and_says_so(tmp_path):
    payloads = _requests()
    replies = _serve(_write_config(tmp_path, {"when": {"score_below": 1.01}, "to_model": "activity_large",
                                              "max_rate_per_s": 0.001}), payloads)
    tiers = [r["tier"] for r in replies]
    assert tiers.count("local-large") == 1  # the bucket holds one token; it refills in 1000 s
    assert all(r.get("escalation") == "rate_limited" for r in replies if r["tier"] == "local")


def test_to_model_local_answers_leave_after_the_large_run_and_say_so(tmp_path):
    """In a `to_model` batch, the local answers (the rate-limited ones among them) are sent
    after the heavier model has run on the escalated rows: their `latency_ms` counts to then. A
    clock that moves one second per reading puts every reading after the one before."""
    config = load_config(_write_config(tmp_path, {"when": {"score_below": 1.01}, "to_model": "activity_large",
                                                  "max_rate_per_s": 0.001}))  # one token: one escalates
    route = config.routes[0]
    model = Model(config.models["activity"].path)
    pipe = route_pipeline(config, route, model)
    large = route_pipeline(config, route.escalate.large_route(route), model)
    ticks = iter(range(1_000))
    clock = lambda: float(next(ticks))  # noqa: E731
    requests = [Request(p, 0.0) for p in _requests()[:4]]
    local = request_path.handle_batch(pipe, requests, model, None, clock)
    out = Cascade(clock).run_local(pipe, large, requests, local, model, None)
    [escalated] = [r for r in out.replies if r["tier"] == "local-large"]
    limited = [r for r in out.replies if r["tier"] == "local"]
    assert len(limited) == 3 and all(r["escalation"] == "rate_limited" for r in limited)
    assert all(r["latency_ms"] > escalated["latency_ms"] for r in limited), out.replies


def test_the_default_rate_turns_a_burst_of_50_into_20_escalations_and_30_rate_limited(tmp_path):
    """The figure docs/config.md and docs/http.md give for the default max_rate_per_s (20/s)."""
    config = load_config(_write_config(tmp_path, {"when": {"score_below": 0.6}, "to_topic": "gpu/{1}/imu"}))
    pipe = route_pipeline(config, config.routes[0], Model(config.models["activity"].path))
    assert pipe.route.escalate.max_rate_per_s == 20.0
    replies = [{"id": i, "top_k": [{"label": "a", "score": 0.5}]} for i in range(50)]
    chosen = Cascade(lambda: 100.0).select(pipe, replies)  # all at one instant: a burst
    assert len(chosen) == 20
    assert [r.get("escalation") for r in replies].count("rate_limited") == 30


def test_token_bucket_refills_at_its_rate():
    now = [0.0]
    bucket = TokenBucket(2.0, lambda: now[0])
    assert [bucket.take() for _ in range(3)] == [True, True, False]
    now[0] = 0.5
    assert bucket.take() and not bucket.take()


def test_the_far_tier_timeout_counts_from_the_requests_arrival():
    """A request that waited in the queue and in local inference has that time taken off its
    wait for the far tier: the user waits for all of it, and its `latency_ms` says so."""
    now = [100.0]
    sent = []
    far = RemoteCascade("r", lambda inbound, topic, reply: sent.append(reply), clock=lambda: now[0])
    late = Inbound(topic="s/a/imu", payload=b"{}", qos=1, mid=1, received_at=99.7)   # arrived 300 ms ago
    fresh = Inbound(topic="s/b/imu", payload=b"{}", qos=1, mid=2, received_at=100.0)
    far.park(late, "results/a", {"id": "late"}, timeout_s=0.5)
    far.park(fresh, "results/b", {"id": "fresh"}, timeout_s=0.5)
    now[0] = 100.25
    far.expire_due()
    assert sent == [{"id": "late", "escalation": "timeout", "latency_ms": 550.0}]
    now[0] = 100.5
    far.expire_due()
    assert [r["id"] for r in sent] == ["late", "fresh"] and far.pending == 0
    assert sent[1]["latency_ms"] == 500.0


# --- to_topic: the far tier is simulated at the transport seam (tests/integration has the real one) ---

ESCALATIONS = "edge-inferd/test-node/escalations"


class FarRecorder(Recorder):
    """Replies as Recorder; escalation requests (publishes with a ResponseTopic) kept apart."""

    def __init__(self):
        super().__init__()
        self.forwarded: list[tuple[str, bytes, bytes]] = []

    def publish(self, topic, payload, retain=False, correlation_data=None, response_topic=None):
        if response_topic is not None:
            assert response_topic == ESCALATIONS
            with self.cond:
                self.forwarded.append((topic, payload, correlation_data))
                self.cond.notify_all()
            return
        super().publish(topic, payload, retain, correlation_data)

    def wait_forwarded(self, n):
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.forwarded) >= n, 30)


def _remote_serving(tmp_path, threshold, stats=None, **escalate):
    config = load_config(_write_config(tmp_path, {"when": {"score_below": threshold}, "to_topic": "gpu/{1}/imu",
                                                  **escalate}))
    models = {"activity": Model(config.models["activity"].path)}
    pipe = route_pipeline(config, config.routes[0], models["activity"])
    d = wiring.build([pipe], None, stats or Stats(), WorkersConfig(max=1), lambda i: models,
                     escalation_topic=ESCALATIONS)
    rec = FarRecorder()
    d.attach(rec)
    d.start()
    return d, rec


def _far_answer(corr: bytes, request: bytes, label="far") -> object:
    reply = {"id": json.loads(request)["id"], "route": "far-route", "model": "big", "model_sha256": "0" * 12,
             "label": label, "index": 0, "score": 0.99, "top_k": [{"label": label, "score": 0.99}],
             "cached": False, "latency_ms": 1.0}
    return _inbound(ESCALATIONS, json.dumps(reply).encode(), 1000, correlation_data=corr)


def test_to_topic_escalates_exactly_the_low_confidence_requests_and_labels_the_tier(tmp_path):
    payloads = _requests()
    scores = _local_scores(payloads)
    threshold = float(np.median(scores))
    low = {i for i, s in enumerate(scores) if s < threshold}
    d, rec = _remote_serving(tmp_path, threshold, timeout_ms=30_000, max_rate_per_s=1000)
    assert ESCALATIONS in d.filters
    for i, payload in enumerate(payloads):
        d.intake.on_message(_inbound("sensors/w7/imu", payload, i + 1))
    rec.wait(N - len(low))
    rec.wait_forwarded(len(low))
    assert {json.loads(p)["id"] for _, p, _ in rec.forwarded} == low
    assert all(topic == "gpu/w7/imu" for topic, _, _ in rec.forwarded)  # the template, rendered
    assert all(r["tier"] == "local" for _, r, _ in rec.published)
    assert len(rec.acked) == N - len(low)  # the escalated ones wait, unacked, holding no worker
    for topic, payload, corr in rec.forwarded:
        d.intake.on_message(_far_answer(corr, payload))
    rec.wait(N)
    assert d.stop(30)
    remote = [r for _, r, _ in rec.published if r["tier"] == "remote"]
    assert {r["id"] for r in remote} == low and all(r["label"] == "far" for r in remote)
    assert all(r["route"] == "activity" for r in remote)
    assert sorted(rec.acked) == sorted(list(range(1, N + 1)) + [1000] * len(low))  # far answers acked too
    assert len(rec.published) == N


def test_timeout_answers_locally_and_a_late_far_answer_is_dropped(tmp_path):
    payloads = _requests()[:3]
    stats = Stats()
    d, rec = _remote_serving(tmp_path, 1.01, stats, timeout_ms=100, max_rate_per_s=1000)  # everything escalates
    started = time.monotonic()
    for i, payload in enumerate(payloads):
        d.intake.on_message(_inbound("sensors/w1/imu", payload, i + 1))
    rec.wait_forwarded(3)
    rec.wait(3)
    waited = time.monotonic() - started
    assert 0.1 <= waited < 2.0
    assert all(r["tier"] == "local" and r["escalation"] == "timeout" for _, r, _ in rec.published)
    topic, payload, corr = rec.forwarded[0]
    d.intake.on_message(_far_answer(corr, payload))  # too late
    assert d.stop(30)
    assert len(rec.published) == 3 and d.remote.late == 1
    assert stats.count("escalations_late") == 1 and stats.count("escalation_timeout") == 3
    assert sorted(rec.acked) == [1, 2, 3, 1000]


FALLBACK_TIMEOUT_MS = 200
FAR_DELAY_S = 0.1


def test_a_timeout_fallback_says_its_latency_from_arrival_and_the_stats_count_the_wait(tmp_path):
    """The local answer is ready in a few ms, but it leaves timeout_ms after arrival: its
    `latency_ms`, the stats' percentiles and their duration histogram all carry the wait."""
    stats = Stats()
    d, rec = _remote_serving(tmp_path, 1.01, stats, timeout_ms=FALLBACK_TIMEOUT_MS, max_rate_per_s=1000)
    for i, payload in enumerate(_requests()[:3]):
        d.intake.on_message(_inbound("sensors/w1/imu", payload, i + 1))
    rec.wait(3)
    assert d.stop(30)
    replies = [r for _, r, _ in rec.published]
    assert all(r["escalation"] == "timeout" and r["latency_ms"] >= FALLBACK_TIMEOUT_MS for r in replies), replies
    latency = stats.snapshot()["latency_ms"]
    assert latency["n"] == 3 and latency["p50"] >= FALLBACK_TIMEOUT_MS, latency
    duration = stats.histograms()["duration"]
    shorter = sum(n for bound, n in zip(duration.bounds, duration.counts) if bound < FALLBACK_TIMEOUT_MS / 1000)
    assert duration.n == 3 and shorter == 0, duration.counts


def test_a_far_error_fallback_says_its_latency_from_arrival(tmp_path):
    """The far tier answers an error a while after the local answer was made: the local answer
    leaves then, and its `latency_ms` counts to then (not to the end of its local inference)."""
    d, rec = _remote_serving(tmp_path, 1.01, timeout_ms=30_000, max_rate_per_s=1000)
    request = _inbound("sensors/w1/imu", _requests()[0], 1)
    d.intake.on_message(request)
    rec.wait_forwarded(1)
    _, _, corr = rec.forwarded[0]
    time.sleep(FAR_DELAY_S)  # the far tier's own time to its answer: the scenario, not a wait on the daemon
    error = {"id": 0, "route": "far", "error": {"code": "overloaded", "message": "busy"}}
    answered_at = time.monotonic()
    d.intake.on_message(_inbound(ESCALATIONS, json.dumps(error).encode(), 9, correlation_data=corr))
    rec.wait(1)
    assert d.stop(30)
    [(_, reply, _)] = rec.published
    assert reply["escalation"] == "error", reply
    assert reply["latency_ms"] >= (answered_at - request.received_at) * 1000 >= FAR_DELAY_S * 1000, reply


def test_rate_cap_answers_locally_at_once(tmp_path):
    payloads = _requests()[:4]
    d, rec = _remote_serving(tmp_path, 1.01, timeout_ms=30_000, max_rate_per_s=0.001)  # one token
    for i, payload in enumerate(payloads):
        d.intake.on_message(_inbound("sensors/w1/imu", payload, i + 1))
    rec.wait(3)
    rec.wait_forwarded(1)
    assert [r.get("escalation") for _, r, _ in rec.published] == ["rate_limited"] * 3
    assert d.stop(30)  # the parked one is answered on stop: never left unanswered
    assert len(rec.published) == 4 and rec.published[-1][1]["escalation"] == "timeout"
    assert sorted(rec.acked) == [1, 2, 3, 4]


def test_a_rate_limited_burst_is_counted_and_logged_once(tmp_path, caplog):
    """A burst past max_rate_per_s is not silent: each such reply is counted, and the log says
    it once per route (then once per interval, with how many it left out)."""
    stats = Stats()
    caplog.set_level(logging.WARNING)
    d, rec = _remote_serving(tmp_path, 1.01, stats, timeout_ms=30_000, max_rate_per_s=0.001)  # one token
    for i, payload in enumerate(_requests()[:6]):
        d.intake.on_message(_inbound("sensors/w1/imu", payload, i + 1))
    rec.wait(5)
    assert d.stop(30)
    said = [r.getMessage() for r in caplog.records if "rate_limited" in r.getMessage()]
    assert len(said) == 1 and "'activity'" in said[0] and "max_rate_per_s (0.001/s)" in said[0], said
    assert stats.count("escalation_rate_limited") == 5


def test_far_error_keeps_the_local_answer(tmp_path):
    d, rec = _remote_serving(tmp_path, 1.01, timeout_ms=30_000, max_rate_per_s=1000)
    d.intake.on_message(_inbound("sensors/w1/imu", _requests()[0], 1))
    rec.wait_forwarded(1)
    _, _, corr = rec.forwarded[0]
    error = {"id": 0, "route": "far", "error": {"code": "overloaded", "message": "busy"}}
    d.intake.on_message(_inbound(ESCALATIONS, json.dumps(error).encode(), 9, correlation_data=corr))
    rec.wait(1)
    assert d.stop(30)
    [(_, reply, _)] = rec.published
    assert reply["tier"] == "local" and reply["escalation"] == "error" and reply["model"] == "activity"


def test_bundled_appliance_large_is_a_valid_escalation_target_and_matches_its_card(tmp_path):
    """models/appliance_large: the appliance route's cascade (with the large model's own
    preprocessing, as its card records it) loads; the card tells the truth; and the large tier
    is worth escalating to: more accurate than the fast model on the held-out split."""
    from daemon.config.reader import absolute_paths
    from daemon.pipeline.evaluate import validate
    from daemon.model.runtime import file_sha256

    card = json.loads((ROOT / "models/appliance_large/card.json").read_text())
    raw = yaml.safe_load((ROOT / "config.yaml").read_text())
    raw["models"]["appliance_large"] = {"path": "models/appliance_large/model.tflite",
                                        "labels": "models/appliance_large/labels.txt"}
    for route in raw["routes"]:
        if route["name"] == "appliance":
            route["escalate"] = {"when": {"score_below": 0.6}, "to_model": "appliance_large",
                                 "preprocess": card["preprocessing"]}
    raw["mqtt"].pop("outbox", None)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(absolute_paths(raw, ROOT)))
    config = load_config(path)
    route = next(r for r in config.routes if r.name == "appliance")
    config = dataclasses.replace(config, routes=(route.escalate.large_route(route),))
    report, _ = validate(config, "appliance", ROOT / "models/appliance_large/test.npz",
                         float_model=ROOT / "models/appliance_large/model_float.tflite")
    assert report["accuracy"] == pytest.approx(card["int8_accuracy"], abs=1e-4)
    assert report["float_accuracy"] == pytest.approx(card["float_accuracy"], abs=1e-4)
    assert report["model_sha256"] == card["sha256"] == file_sha256(ROOT / "models/appliance_large/model.tflite")
    fast = json.loads((ROOT / "models/appliance/card.json").read_text())
    assert report["accuracy"] > fast["int8_accuracy"]
