"""Property: every request gets exactly one reply, of a contract code, whatever its bytes.

hypothesis generates arbitrary bytes, arbitrary JSON and request-shaped JSON with
arbitrary ids and data; serving runs them through the real pipeline and the real
INT8 model (one worker), and each request must be answered once and acked once.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon.config.schema import BatchingConfig, WorkersConfig
from daemon.config.loader import load_config
from daemon.serve import wiring
from daemon.errors import ERROR_CODES
from daemon.pipeline.route_pipeline import route_pipeline
from daemon.transport.inbound import Inbound
from daemon.model.runtime import Model
from daemon.obs.stats import Stats
from tests.floats import SUBNORMALS

ROOT = Path(__file__).resolve().parents[1]
WAIT_S = 30.0
LABELS = (ROOT / "models/activity/labels.txt").read_text().split()

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_subnormal=SUBNORMALS) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=8) | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=40)
requests = st.one_of(
    st.binary(max_size=3000),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.builds(lambda i, d: json.dumps({"id": i, "data": d}).encode(), json_values, json_values),
    st.builds(lambda i, rows: json.dumps({"id": i, "data": rows}).encode(), json_values,
              st.lists(st.lists(st.floats(width=32, allow_subnormal=SUBNORMALS), min_size=6, max_size=6),
                       min_size=100, max_size=100)),
    st.integers(1, 5000).map(lambda depth: b'{"id": 1, "data": ' + b"[" * depth + b"]" * depth + b"}"),
)


class Replies:
    def __init__(self):
        self.cond = threading.Condition()
        self.replies: list[tuple[int, dict]] = []
        self.acks: list[int] = []

    def publish(self, topic, payload, retain=False, correlation_data=None):
        raise AssertionError("replies go through reply()")

    def reply(self, topic, payload, inbound):
        with self.cond:
            self.replies.append((inbound.mid, json.loads(payload)))
            self.acks.append(inbound.mid)
            self.cond.notify_all()

    def ack(self, inbound):
        with self.cond:
            self.acks.append(inbound.mid)

    def batch(self):
        import contextlib
        return contextlib.nullcontext()


_DISPATCHER: list[wiring.Serving] = []


def _serving() -> wiring.Serving:
    if not _DISPATCHER:
        config = load_config(ROOT / "config.yaml")
        route = config.routes[0]
        pipe = route_pipeline(config, route, Model(config.models["activity"].path))
        models = {"activity": Model(config.models["activity"].path, max_batch=8)}
        d = wiring.build([pipe], None, Stats(), WorkersConfig(max=1), lambda i: models, BatchingConfig(max_batch=8))
        d.start()
        _DISPATCHER.append(d)
    return _DISPATCHER[0]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(requests, min_size=1, max_size=12))
def test_every_request_gets_exactly_one_reply_of_a_contract_code(payloads):
    d = _serving()
    out = Replies()
    d.attach(out)
    for mid, payload in enumerate(payloads, start=1):
        d.intake.on_message(Inbound(topic="sensors/f1/imu", payload=payload, qos=1, mid=mid, received_at=time.monotonic()))
    with out.cond:
        assert out.cond.wait_for(lambda: len(out.replies) >= len(payloads), WAIT_S)
    mids = sorted(mid for mid, _ in out.replies)
    assert mids == list(range(1, len(payloads) + 1))  # one reply each
    assert sorted(out.acks) == mids  # one ack each, none for a request twice
    for _, reply in out.replies:
        if "error" in reply:
            assert reply["error"]["code"] in ERROR_CODES and reply["error"]["code"] != "internal", reply
        else:
            assert reply["label"] in LABELS and reply["route"] == "activity"
