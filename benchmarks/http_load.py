"""Open-loop HTTP load for benchmarks/bench_http.py, and the bare stdlib echo it is compared with.

- `Schedule`: request k of a measurement is due at start + k / rate, whatever the answers do;
  each sample is timed from when it was due, so a request a busy connection could only send late
  still counts its wait (no coordinated omission).
- `http_load`: v2 infer requests over N keep-alive connections (`Connection`, a raw-socket
  client), each a thread sending every N-th request of the schedule.
- `EchoServer` / `EchoHandler`: ThreadingHTTPServer as one writes it to be fast (TCP_NODELAY and
  buffered writes: the shipped default stalls keep-alive replies ~40 ms), a fixed small v2 body.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOST = "127.0.0.1"
DEVICE_HEADER = "X-Device"
START_LEAD_S = 0.2  # the threads start before the first request is due
REPLY_TIMEOUT_S = 10.0  # an HTTP request unanswered this long counts as lost
READY_S = 60.0
RECV_BYTES = 65536
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length: *(\d+)")
ECHO_BODY = b'{"model_name": "echo", "outputs": [{"name": "label", "datatype": "BYTES", "shape": [1], ' \
            b'"data": ["x"]}], "parameters": {"cached": [false]}}'


class EchoHandler(BaseHTTPRequestHandler):
    """The floor: read the body, answer a fixed body. HTTP/1.1 keep-alive; TCP_NODELAY and a buffered
    wfile so the reply leaves in one write (as shipped, the body write waits ~40 ms for a delayed ACK)."""

    protocol_version = "HTTP/1.1"
    wbufsize = -1

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(ECHO_BODY)))
        self.end_headers()
        self.wfile.write(ECHO_BODY)

    do_GET = do_POST  # the readiness check

    def log_message(self, *args) -> None:
        pass


class EchoServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the default backlog of 5 drops some of 16 simultaneous connects (1 s SYN retry)


def wait_ready(port: int, proc: subprocess.Popen, what: str) -> None:
    """Until GET /v2/health/ready answers 200 (the echo answers every GET so)."""
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            conn = http.client.HTTPConnection(HOST, port, timeout=1)
            conn.request("GET", "/v2/health/ready")
            if conn.getresponse().status == 200:
                return conn.close()
        except OSError:
            pass
        time.sleep(0.1)  # start-up of a child process; the limit bounds a failure
    raise RuntimeError(f"{what} never answered on port {port}")


class Schedule:
    """Request k of a measurement is due at start + k / rate; the first `warm` are not counted."""

    def __init__(self, first_id: int, rate: float, warmup_s: float, duration_s: float):
        self.warm, self.n = int(rate * warmup_s), int(rate * (warmup_s + duration_s))
        self.first_id, self.rate = first_id, rate
        self.start = time.perf_counter() + START_LEAD_S
        self.window_start = self.start + self.warm / rate
        self.samples: dict[int, list] = {}  # id -> [due, sent, done, kind]

    def wait(self, k: int) -> int:
        """Sleep until request k is due; its id, its sample started."""
        due = self.start + k / self.rate
        time.sleep(max(0.0, due - time.perf_counter()))
        self.samples[self.first_id + k] = [due, time.perf_counter(), None, "lost"]
        return self.first_id + k

    def measured(self) -> list[list]:
        return [self.samples[self.first_id + k] for k in range(self.warm, self.n) if self.first_id + k in self.samples]


def v2_body(workload, i: int) -> bytes:
    shape = b", ".join(b"%d" % d for d in (1, *workload.route.input.shape))
    return b'{"id": "%d", "inputs": [{"name": "input", "shape": [%s], "datatype": "FP32", "data": %s}]}' % (
        i, shape, workload.data(i))


def kind(status: int, payload: bytes) -> str:
    if status != 200:
        return str(status)
    try:
        body = json.loads(payload)
    except ValueError:
        return "bad_json"
    if not body.get("outputs"):
        return "no_outputs"
    return "hit" if any(body.get("parameters", {}).get("cached", [])) else "result"


class Connection:
    """A minimal HTTP/1.1 keep-alive client on a raw socket: http.client cost the bench ~430 µs of
    CPU per request (its header parsing and buffering), on the cores the servers it measures share."""

    def __init__(self, port: int):
        self.sock = socket.create_connection((HOST, port), timeout=REPLY_TIMEOUT_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def post(self, request: bytes) -> tuple[int, bytes, bool]:
        """Send one whole request; (status, body, whether the server keeps the connection)."""
        self.sock.sendall(request)
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            self._recv()
        head, self.buf = self.buf[:end].lower(), self.buf[end + 4:]
        found = _CONTENT_LENGTH.search(head)
        if found is None:  # the daemon's listener gives every answer its length (docs/http.md)
            raise ConnectionError("an answer without Content-Length")
        length = int(found.group(1))
        while len(self.buf) < length:
            self._recv()
        body, self.buf = self.buf[:length], self.buf[length:]
        return int(head[9:12]), body, head.startswith(b"http/1.1") and b"\r\nconnection: close" not in head

    def _recv(self) -> None:
        chunk = self.sock.recv(RECV_BYTES)
        if not chunk:
            raise ConnectionError("closed by the server")
        self.buf += chunk


def _connection(port: int, path: str, device: str, workload, plan: Schedule, ks: range) -> None:
    """One keep-alive connection's share of the schedule; a closed or failed connection is reopened."""
    head = b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n%s: %s\r\n" \
           b"Content-Length: %%d\r\n\r\n" % (path.encode(), HOST.encode(), DEVICE_HEADER.encode(), device.encode())
    conn = None
    for k in ks:
        body = v2_body(workload, plan.first_id + k)
        request = head % len(body) + body
        sample = plan.samples[plan.wait(k)]
        try:
            conn = conn or Connection(port)
            status, payload, keep = conn.post(request)
            sample[2:] = [time.perf_counter(), kind(status, payload)]
        except OSError as exc:
            sample[3], keep = type(exc).__name__, False
        if not keep and conn is not None:
            conn.sock.close()
            conn = None
    if conn is not None:
        conn.sock.close()


def http_load(port: int, path: str, device: str, workload, plan: Schedule, connections: int) -> threading.Thread:
    """`plan` over `connections` threads, connection c sending requests c, c + connections, ...; the
    thread returned ends once they all have. `workload`: `route.input.shape` and `data(i)`, the
    JSON of row i (daemon/tools/bench/workload.py); `device`: the X-Device header."""
    def all_of_them() -> None:
        threads = [threading.Thread(target=_connection, args=(port, path, device, workload, plan,
                                                                  range(c, plan.n, connections)))
                   for c in range(connections)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    waiter = threading.Thread(target=all_of_them, daemon=True)
    waiter.start()
    return waiter
