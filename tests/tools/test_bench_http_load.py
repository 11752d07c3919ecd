"""benchmarks/bench_http.py's HTTP side: the open-loop schedule over keep-alive connections, against its echo."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from benchmarks.http_load import EchoHandler, EchoServer, Schedule, http_load
from daemon.tools.broker import free_port

WORKLOAD = SimpleNamespace(route=SimpleNamespace(input=SimpleNamespace(shape=(2,))), data=lambda i: b"[%d, 0.5]" % i)


class _OneShot(EchoHandler):
    protocol_version = "HTTP/1.0"  # closes the connection after each answer


class _NotFound(EchoHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_error(404)


def _serve(handler) -> tuple[EchoServer, int]:
    port = free_port()
    server = EchoServer(("127.0.0.1", port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, port


@pytest.mark.parametrize("handler, kind", [(EchoHandler, "result"), (_OneShot, "result"), (_NotFound, "404")])
def test_every_request_of_the_schedule_is_sent_once_and_timed_from_when_it_was_due(handler, kind):
    server, port = _serve(handler)
    try:
        plan = Schedule(first_id=100, rate=200.0, warmup_s=0.1, duration_s=0.2)
        http_load(port, "/v2/models/m/infer", "dev", WORKLOAD, plan, connections=4).join(10)
    finally:
        server.shutdown()
        server.server_close()
    assert sorted(plan.samples) == list(range(100, 100 + plan.n)) and plan.n == 60
    measured = plan.measured()
    assert len(measured) == 40 and {s[3] for s in measured} == {kind}
    assert all(due <= sent < done for due, sent, done, _ in measured)
