"""Real servers for the fetch tests: nginx (Range, If-Range, strong ETags), Python's http.server
(which ignores Range), a TCP proxy that cuts a connection after N bytes, and a scripted server
that answers with fixed bytes and then closes or goes silent (a stall).

The processes run through daemon/tools/broker.py's BrokerProcess: a free loopback port, a
config in the work dir, ready once the port accepts.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from daemon.tools.broker import BrokerProcess

LOOPBACK = "127.0.0.1"
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
OPENSSL = shutil.which("openssl")
WAIT_S = 10.0
_POLL_S = 0.02
_RECV_BYTES = 64 << 10
_BACKLOG = 16
# The busy path: nginx answers 503 there (a server that is up but cannot serve yet).
BUSY_PATH = "/busy.bin"
# nginx's access log, one request a line (tab-separated; `escape=none` keeps the quotes of an
# ETag, and logs an absent header as empty): what the tests read the Range traffic from.
LOG_FIELDS = ("method", "uri", "status", "bytes", "range", "if_range", "authorization")
_LOG_FORMAT = "\t".join(("$request_method", "$uri", "$status", "$body_bytes_sent", "$http_range", "$http_if_range",
                         "$http_authorization"))


def wait_until(predicate: Callable[[], object], what: str, timeout_s: float = WAIT_S):
    """Poll `predicate` until it is true; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(_POLL_S)


class Nginx(BrokerProcess):
    """nginx serving `root` on a free loopback port; `requests()` reads its access log."""

    name = "nginx"
    log_name = "nginx.out"

    def __init__(self, workdir: Path, root: Path, ssl_files: Optional[tuple[Path, Path]] = None):
        """`ssl_files`: (certificate, key): it listens with TLS."""
        super().__init__(workdir)
        self.root = root
        self._ssl = ssl_files

    @property
    def access_log(self) -> Path:
        return self.workdir / "access.log"

    def url(self, name: str) -> str:
        # With TLS by name: the test's certificate is for localhost.
        base = f"https://localhost:{self.port}" if self._ssl else f"http://{LOOPBACK}:{self.port}"
        return f"{base}/{name}"

    def requests(self) -> list[dict[str, str]]:
        if not self.access_log.exists():
            return []
        return [dict(zip(LOG_FIELDS, line.split("\t"))) for line in self.access_log.read_text().splitlines()]

    def wait_requests(self, count: int) -> list[dict[str, str]]:
        """The access log once it has `count` lines (nginx writes a line when a request ends)."""
        return wait_until(lambda: len(self.requests()) >= count and self.requests(), f"{count} requests in nginx's log")

    def _command(self) -> list[str]:
        (self.workdir / "temp").mkdir(exist_ok=True)
        conf = self.workdir / "nginx.conf"
        conf.write_text(self._config())
        return [NGINX, "-p", str(self.workdir), "-c", str(conf)]

    def _config(self) -> str:
        w = self.workdir
        temps = "".join(f"  {kind}_temp_path {w}/temp/{kind};\n" for kind in ("client_body", "proxy", "fastcgi",
                                                                               "uwsgi", "scgi"))
        listen = f"{LOOPBACK}:{self.port}" + (" ssl" if self._ssl else "")
        tls = "" if not self._ssl else f"    ssl_certificate {self._ssl[0]};\n    ssl_certificate_key {self._ssl[1]};\n"
        # As root nginx's workers would run as nobody; the test's files are root's.
        user = "user root;\n" if os.geteuid() == 0 else ""
        return (f"daemon off;\nworker_processes 1;\npid {w}/nginx.pid;\nerror_log {w}/error.log info;\n{user}"
                "events { worker_connections 64; }\n"
                "http {\n"
                f"  log_format fetch escape=none '{_LOG_FORMAT}';\n"
                f"  access_log {w}/access.log fetch;\n{temps}"
                "  server {\n"
                f"    listen {listen};\n    root {self.root};\n{tls}"
                f"    location = {BUSY_PATH} {{ return 503; }}\n"
                "  }\n}\n")


class HttpServer(BrokerProcess):
    """`python -m http.server` serving `root`: HTTP/1.0, Last-Modified and no ETag, no Range."""

    name = "http.server"
    log_name = "http.server.log"  # its request lines go to stderr

    def __init__(self, workdir: Path, root: Path):
        super().__init__(workdir)
        self.root = root

    def url(self, name: str) -> str:
        return f"http://{LOOPBACK}:{self.port}/{name}"

    def request_lines(self) -> list[str]:
        return [line for line in self.log_path.read_text().splitlines() if '"GET ' in line]

    def _command(self) -> list[str]:
        return [sys.executable, "-m", "http.server", str(self.port), "--bind", LOOPBACK, "--directory", str(self.root)]


class _Listener:
    """A loopback listener on a free port, each connection served on its own thread."""

    def __init__(self):
        self._sock = socket.create_server((LOOPBACK, 0), backlog=_BACKLOG)
        self.port = self._sock.getsockname()[1]
        self.stopped = threading.Event()
        self.connections = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        # close() alone does not wake a thread blocked in accept() on Linux; shutdown() does.
        _shutdown(self._sock)
        self._sock.close()
        self._thread.join(WAIT_S)

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed by __exit__
            with self._lock:
                index, self.connections = self.connections, self.connections + 1
            threading.Thread(target=self._serve_quietly, args=(conn, index), daemon=True).start()

    def _serve_quietly(self, conn: socket.socket, index: int) -> None:
        try:
            self._serve(conn, index)
        except OSError:
            pass  # the client went away: the test judges what the client saw
        finally:
            conn.close()

    def _serve(self, conn: socket.socket, index: int) -> None:
        raise NotImplementedError


class CuttingProxy(_Listener):
    """Forwards to `upstream_port`; the i-th connection is cut after `cuts[i]` bytes towards the
    client (None, or past the list: not cut). `on_cut(i)` runs before the client sees the cut."""

    def __init__(self, upstream_port: int, cuts: Sequence[Optional[int]],
                 on_cut: Optional[Callable[[int], None]] = None):
        super().__init__()
        self._upstream = upstream_port
        self._cuts = list(cuts)
        self._on_cut = on_cut
        self.cut = 0

    def url(self, name: str) -> str:
        return f"http://{LOOPBACK}:{self.port}/{name}"

    def _serve(self, conn: socket.socket, index: int) -> None:
        limit = self._cuts[index] if index < len(self._cuts) else None
        with socket.create_connection((LOOPBACK, self._upstream)) as upstream:
            ahead = threading.Thread(target=self._pump, args=(conn, upstream, None), daemon=True)
            ahead.start()
            if self._pump(upstream, conn, limit):
                self.cut += 1
                if self._on_cut is not None:
                    self._on_cut(index)
            for sock in (conn, upstream):
                _shutdown(sock)
            ahead.join(WAIT_S)

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket, limit: Optional[int]) -> bool:
        """Copy until EOF (then pass the EOF on) or `limit` bytes; True when it cut."""
        sent = 0
        while True:
            try:
                data = source.recv(_RECV_BYTES)
            except OSError:
                return False
            if not data:
                _shutdown(sink, socket.SHUT_WR)
                return False
            if limit is not None and sent + len(data) >= limit:
                sink.sendall(data[:limit - sent])
                return True
            sink.sendall(data)
            sent += len(data)


class ScriptedServer(_Listener):
    """Reads each request's head, answers `response` (raw bytes: status line, headers, body),
    then closes, or with `hold` stays silent until the test ends (a stalled server)."""

    def __init__(self, response: bytes, hold: bool = False):
        super().__init__()
        self._response = response
        self._hold = hold

    def url(self, name: str) -> str:
        return f"http://{LOOPBACK}:{self.port}/{name}"

    def _serve(self, conn: socket.socket, index: int) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            data = conn.recv(_RECV_BYTES)
            if not data:
                return
            head += data
        conn.sendall(self._response)
        if self._hold:
            self.stopped.wait()


def make_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A private CA and a certificate for localhost signed by it: (ca.pem, server.pem, server.key),
    made with the openssl command line."""
    ca_key, ca, key, csr, cert = (directory / n for n in ("ca.key", "ca.pem", "server.key", "server.csr",
                                                           "server.pem"))
    ext = directory / "server.ext"
    ext.write_text("subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for command in (["req", "-x509", *ec, "-keyout", ca_key, "-out", ca, "-days", "2", "-subj", "/CN=test CA"],
                    ["req", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=localhost"],
                    ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert,
                     "-days", "2", "-extfile", ext]):
        subprocess.run([OPENSSL, *map(str, command)], check=True, capture_output=True)
    return ca, cert, key


def _shutdown(sock: socket.socket, how: int = socket.SHUT_RDWR) -> None:
    try:
        sock.shutdown(how)
    except OSError:
        pass  # already closed by the other side
