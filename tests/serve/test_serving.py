"""Dispatch: routing, shedding and the `internal` reply, with real interpreters.

The transport is a recorder at the transport seam (publish/ack), not a broker: the
broker paths are covered by tests/integration.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path

import numpy as np

from daemon.config.schema import WorkersConfig
from daemon.config.loader import load_config
from daemon.serve import wiring
from daemon.pipeline.route_pipeline import route_pipeline
from daemon.transport.inbound import Inbound
from daemon.model.runtime import Model
from daemon.obs.stats import Stats

ROOT = Path(__file__).resolve().parents[2]


class Recorder:
    def __init__(self):
        self.published: list[tuple[str, dict, object]] = []
        self.acked: list[int] = []
        self.cond = threading.Condition()

    def publish(self, topic, payload, retain=False, correlation_data=None):
        with self.cond:
            self.published.append((topic, json.loads(payload), correlation_data))
            self.cond.notify_all()

    def ack(self, inbound):
        self.acked.append(inbound.mid)

    def reply(self, topic, payload, inbound):
        self.publish(topic, payload, correlation_data=inbound.correlation_data)
        self.ack(inbound)

    def batch(self):
        return contextlib.nullcontext()

    def wait(self, n):
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.published) >= n, 30)


def _inbound(topic: str, payload: bytes, mid: int, **kw) -> Inbound:
    kw.setdefault("received_at", time.monotonic())
    return Inbound(topic=topic, payload=payload, qos=1, mid=mid, **kw)


ONE_WORKER = WorkersConfig(max=1)


def _serving(models_for_worker, workers=ONE_WORKER, stats=None):
    config = load_config(ROOT / "config.yaml")
    route = config.routes[0]
    pipe = route_pipeline(config, route, Model(config.models["activity"].path))
    return wiring.build([pipe], None, stats or Stats(), workers, lambda i: models_for_worker)


def _request(i: int) -> bytes:
    with np.load(ROOT / "models/activity/test.npz") as data:
        return json.dumps({"id": i, "data": data["x"][i].tolist()}).encode()


def test_model_failure_is_answered_internal_and_the_worker_survives():
    wrong = {"activity": Model(ROOT / "tests/fixtures/digits/model.tflite")}  # a real model that does not fit
    d = _serving(wrong)
    rec = Recorder()
    d.attach(rec)
    d.start()
    d.intake.on_message(_inbound("sensors/w1/imu", _request(0), 1))
    d.intake.on_message(_inbound("sensors/w1/imu", _request(1), 2, response_topic="me/r", correlation_data=b"c"))
    rec.wait(2)
    assert d.stop(30)
    (t1, r1, _), (t2, r2, c2) = rec.published
    assert t1 == "results/w1/activity" and r1["error"]["code"] == "internal" and r1["route"] == "activity"
    assert r1["id"] == 0 and "does not match" in r1["error"]["message"]
    assert (t2, c2, r2["error"]["code"]) == ("me/r", b"c", "internal")
    assert rec.acked == [1, 2]


def test_unroutable_topic_is_acked_and_counted_never_fatal():
    stats = Stats()
    d = _serving({"activity": Model(ROOT / "models/activity/model.tflite")}, stats=stats)
    rec = Recorder()
    d.attach(rec)
    d.intake.on_message(_inbound("nobody/listens/here", b"x", 7))
    assert rec.published == [] and rec.acked == [7]
    assert stats.count("unroutable") == 1


def test_shedding_parses_no_json_and_keeps_the_leading_id():
    """A refused request is answered from a prefix scan: its body is never parsed (it is not even valid)."""
    stats = Stats()
    d = _serving({}, workers=WorkersConfig(max=1, queue_mb=0.01), stats=stats)  # ~10 KB; never started
    rec = Recorder()
    d.attach(rec)
    small = b'{"id": "fits", "data": [1, 2'  # queued (the pool is not started, so it stays queued)
    big = b'{"id": "big", "data": [' + b"1.5, " * 3000 + b"oops"  # 15 KB: past the budget, invalid JSON
    d.intake.on_message(_inbound("sensors/w1/imu", small, 1))
    d.intake.on_message(_inbound("sensors/w1/imu", big, 2)._replace(qos=0))  # QoS 1 would wait unread instead
    [(topic, reply, _)] = rec.published
    assert topic == "results/w1/activity" and reply["id"] == "big"
    assert reply["error"]["code"] == "overloaded" and "workers.queue_mb" in reply["error"]["message"]
    assert rec.acked == [2] and d.pool.depth == 1 and stats.count("errors.overloaded") == 1


def test_a_batch_answers_each_request_and_acks_it_after_its_reply():
    models = {"activity": Model(ROOT / "models/activity/model.tflite", max_batch=8)}
    d = _serving(models)
    rec = Recorder()
    d.attach(rec)
    for i in range(6):  # queued before the worker starts: one batch of 6
        d.intake.on_message(_inbound("sensors/b1/imu", _request(i) if i != 3 else b"{bad", 10 + i))
    d.start()
    rec.wait(6)
    assert d.stop(30)
    assert [r["id"] for _, r, _ in rec.published] == [0, 1, 2, None, 4, 5]
    assert [r.get("error", {}).get("code") for _, r, _ in rec.published] == [None] * 3 + ["bad_payload"] + [None] * 2
    assert rec.acked == [10, 11, 12, 13, 14, 15]
