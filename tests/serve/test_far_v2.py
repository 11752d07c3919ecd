"""The `to_v2` far tier against a stdlib HTTP server that answers as the test scripts it: the rows
escalated together go in one infer call, a far answer replaces the local one, and every failure
(an HTTP error, garbage, a wrong width, a refused port, a server too slow) leaves the local answer
with one `escalation` mark, exactly once per request; the breaker stops calling a failing server.
The real servers (MLServer, KServe) are tests/integration/test_far_v2.py's."""

from __future__ import annotations

import dataclasses
import http.server
import json
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from daemon.config.escalate import EscalateConfig
from daemon.config.escalate_v2 import V2TierConfig
from daemon.config.loader import load_config
from daemon.model import preprocess
from daemon.pipeline.route_pipeline import RoutePipeline
from daemon.serve.cascade import Cascade
from daemon.serve.far_v2 import V2Cascade
from daemon.transport.inbound import Inbound

ROOT = Path(__file__).resolve().parents[2]
LABELS = ("a", "b", "c", "d", "e", "f")
WAIT_S = 10.0


class FarServer:
    """A v2 infer endpoint on a free port; `answer(body) -> (status, bytes)` decides each reply."""

    def __init__(self, answer):
        self.calls: list[dict] = []
        self.answer = answer
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802 -- http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.calls.append({"path": self.path, "headers": dict(self.headers), "body": body})
                status, data = outer.answer(body)
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def scores_of(body: bytes) -> tuple[int, bytes]:
    """A far model that puts all the score of the call's row k on class k % 6: the answers show
    that each request got its own row's."""
    request = json.loads(body)
    tensor = request["inputs"][0]
    rows = np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
    scores = np.zeros((len(rows), len(LABELS)), dtype=np.float32)
    scores[np.arange(len(rows)), np.arange(len(rows)) % len(LABELS)] = 1.0
    out = {"name": "scores", "shape": list(scores.shape), "datatype": "FP32", "data": scores.reshape(-1).tolist()}
    return 200, json.dumps({"model_name": "far", "model_version": "7", "outputs": [out]}).encode()


def make_pipe(url: str, **tier) -> RoutePipeline:
    route = load_config(ROOT / "config.yaml").routes[0]  # activity: json [100, 6], no preprocess steps
    v2 = V2TierConfig(url=url, model="far", **{"timeout_ms": 2000.0, **tier})
    esc = EscalateConfig(score_below=1.01, to_v2=v2, max_rate_per_s=1000)
    return RoutePipeline.build(dataclasses.replace(route, escalate=esc), "ab" * 32, LABELS)


class Job:
    def __init__(self, i: int, received_at: float):
        data = np.full((100, 6), float(i), dtype=np.float32)
        payload = json.dumps({"id": i, "data": data.tolist()}).encode()
        self.inbound = Inbound("sensors/w1/imu", payload, 1, i + 1, received_at)
        self.reply_topic = "results/w1/activity"


def local(i: int) -> dict:
    return {"id": i, "route": "activity", "model": "activity", "model_sha256": "ab" * 6, "label": "a", "index": 0,
            "score": 0.5, "top_k": [{"label": "a", "score": 0.5}], "cached": False, "latency_ms": 1.0}


class Sent:
    def __init__(self):
        self.replies: dict[int, list[dict]] = {}
        self.cond = threading.Condition()

    def __call__(self, inbound, topic, reply):
        with self.cond:
            self.replies.setdefault(reply["id"], []).append(reply)
            self.cond.notify_all()

    def wait(self, n: int) -> dict[int, dict]:
        """Once `n` requests have been answered: each one's reply (each answered once)."""
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.replies) >= n, WAIT_S), self.replies
        assert all(len(r) == 1 for r in self.replies.values()), self.replies
        return {i: r[0] for i, r in self.replies.items()}

    def wait_for(self, i: int) -> dict:
        with self.cond:
            assert self.cond.wait_for(lambda: i in self.replies, WAIT_S), self.replies
            return self.replies[i][0]


@pytest.fixture
def far():
    servers = []

    def start(answer=scores_of):
        servers.append(FarServer(answer))
        return servers[-1]
    yield start
    for server in servers:
        server.close()


def run(pipe: RoutePipeline, ids, sent: Sent, tier: V2Cascade = None, now=None):
    tier = tier or V2Cascade([pipe], sent)
    jobs = [Job(i, time.monotonic() if now is None else now) for i in ids]
    replies = tier.hand_off(Cascade(time.monotonic), pipe, jobs, [local(i) for i in ids])
    return tier, replies


def test_rows_escalated_together_go_in_one_call_and_the_far_scores_answer(far):
    server = far()
    pipe = make_pipe(server.url, batch=8, concurrency=1, headers=(("Host", "far.example"),))
    sent = Sent()
    tier = V2Cascade([pipe], sent)
    tier.start()
    try:
        _, replies = run(pipe, range(8), sent, tier)
        assert replies == [None] * 8  # parked: the worker does not wait
        got = sent.wait(8)
    finally:
        tier.stop()
    assert len(server.calls) == 1 and server.calls[0]["path"] == "/v2/models/far/infer"
    assert server.calls[0]["headers"]["Host"] == "far.example"
    # The route's preprocessing (activity's downsampling; no escalate.preprocess): the far model's input.
    shape = preprocess.output_shape(pipe.route.preprocess, pipe.route.input.shape)
    assert json.loads(server.calls[0]["body"])["inputs"][0]["shape"] == [8, *shape] and shape != (100, 6)
    for i, reply in got.items():
        assert reply["tier"] == "remote" and reply["label"] == LABELS[i % 6] and reply["score"] == 1.0
        assert (reply["model"], reply["model_version"], reply["model_sha256"]) == ("far", "7", None)
        assert "escalation" not in reply and reply["id"] == i


@pytest.mark.parametrize("answer, why", [
    (lambda body: (500, b"Traceback: the model raised"), "an HTTP error"),
    (lambda body: (200, b"<html>not json</html>"), "not JSON"),
    (lambda body: (200, json.dumps({"outputs": [{"name": "scores", "shape": [1, 6], "datatype": "FP32",
                                                  "data": [0.1] * 6}]}).encode()), "too few rows"),
    (lambda body: (200, json.dumps({"outputs": [{"name": "scores", "shape": [2, 4], "datatype": "FP32",
                                                  "data": [0.1] * 8}]}).encode()), "4 scores, not 6"),
    (lambda body: (200, json.dumps({"outputs": [{"name": "scores", "shape": [2, 6], "datatype": "BYTES",
                                                  "data": ["x"] * 12}]}).encode()), "not numbers"),
])
def test_a_bad_answer_leaves_the_local_answer_marked_error(far, answer, why):
    server = far(answer)
    pipe = make_pipe(server.url, concurrency=1)
    sent = Sent()
    tier, _ = run(pipe, [0, 1], sent)
    tier.start()
    try:
        got = sent.wait(2)
    finally:
        tier.stop()
    assert all(r["tier"] == "local" and r["escalation"] == "error" and r["model"] == "activity"
               for r in got.values()), (why, got)


def test_a_refused_port_falls_back_and_the_breaker_then_stops_calling(far):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    pipe = make_pipe(dead, concurrency=1, batch=1, breaker_failures=2, breaker_open_s=60)
    sent = Sent()
    tier = V2Cascade([pipe], sent)
    tier.start()
    try:
        run(pipe, [0, 1], sent, tier)
        first = sent.wait(2)
        _, replies = run(pipe, [2, 3], sent, tier)  # open: answered at once, on the worker, not parked
    finally:
        tier.stop()
    assert all(r["escalation"] == "error" for r in first.values())
    assert [r["escalation"] for r in replies] == ["error", "error"] and tier.snapshot()["routes"]["activity"]["breaker_open"]


def test_the_breaker_tries_again_after_open_s_and_closes_on_success(far):
    failing = {"on": True}
    server = far(lambda body: (503, b"{\"error\": \"warming up\"}") if failing["on"] else scores_of(body))
    pipe = make_pipe(server.url, concurrency=1, batch=1, breaker_failures=1, breaker_open_s=0.2)
    sent = Sent()
    tier = V2Cascade([pipe], sent)
    tier.start()
    refused = 0
    try:
        run(pipe, [0], sent, tier)
        assert sent.wait_for(0)["escalation"] == "error" and tier.snapshot()["routes"]["activity"]["breaker_open"]
        failing["on"] = False
        i, deadline = 1, time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            _, replies = run(pipe, [i], sent, tier)
            if replies[0] is None:  # parked: the breaker let the trial call go
                break
            assert replies[0]["escalation"] == "error"  # still open: answered at once, no call
            refused, i = refused + 1, i + 1
            time.sleep(0.01)
        trial = sent.wait_for(i)
    finally:
        tier.stop()
    assert trial["tier"] == "remote" and refused > 0 and len(server.calls) == 2
    assert not tier.snapshot()["routes"]["activity"]["breaker_open"] and tier.snapshot()["routes"]["activity"]["breaker_episodes"] == 1


def test_a_server_slower_than_the_deadline_gets_the_local_answer_in_time_and_its_answer_is_dropped(far):
    release = threading.Event()

    def slow(body):
        release.wait(WAIT_S)
        return scores_of(body)
    server = far(slow)
    pipe = make_pipe(server.url, concurrency=1, timeout_ms=200)
    sent = Sent()
    tier = V2Cascade([pipe], sent)
    tier.start()
    try:
        started = time.monotonic()
        run(pipe, [0, 1], sent, tier)
        got = sent.wait(2)
        answered_in = time.monotonic() - started
        release.set()
        deadline = time.monotonic() + WAIT_S
        while tier.late < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        tier.stop()
    assert all(r["escalation"] == "timeout" and r["tier"] == "local" for r in got.values())
    assert all(r["latency_ms"] >= 200 for r in got.values()), got  # from arrival: the wait counts
    assert answered_in < 2.0 and tier.late == 2 and len(sent.replies[0]) == 1


FAR_DELAY_S = 0.1
EARLIER_S = 0.5


def test_an_error_fallback_counts_its_latency_from_arrival_on_a_call_and_at_once(far):
    """The local answer (made with `latency_ms` 1.0 here) leaves when the far tier failed: after
    a call that took FAR_DELAY_S, or at once while the breaker is open for a request that
    arrived EARLIER_S ago. Its `latency_ms` counts from arrival to then, both ways."""
    def slow_error(body):
        time.sleep(FAR_DELAY_S)  # the far tier's own time to its error: the scenario, not a wait on the daemon
        return 500, b"Traceback: the model raised"
    server = far(slow_error)
    pipe = make_pipe(server.url, concurrency=1, batch=1, breaker_failures=1, breaker_open_s=60)
    sent = Sent()
    tier = V2Cascade([pipe], sent)
    tier.start()
    try:
        run(pipe, [0], sent, tier)
        called = sent.wait_for(0)
        _, replies = run(pipe, [1], sent, tier, now=time.monotonic() - EARLIER_S)  # the breaker is open
    finally:
        tier.stop()
    assert called["escalation"] == "error" and called["latency_ms"] >= FAR_DELAY_S * 1000, called
    assert replies[0]["escalation"] == "error" and replies[0]["latency_ms"] >= EARLIER_S * 1000, replies


def test_stop_answers_every_parked_request_locally(far):
    release = threading.Event()
    server = far(lambda body: (release.wait(WAIT_S), scores_of(body))[1])
    pipe = make_pipe(server.url, concurrency=1, timeout_ms=60_000)
    sent = Sent()
    tier = V2Cascade([pipe], sent)
    tier.start()
    run(pipe, range(3), sent, tier)
    tier.stop()
    release.set()
    got = sent.wait(3)
    assert all(r["escalation"] == "timeout" for r in got.values()) and tier.pending == 0
