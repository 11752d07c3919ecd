"""The HTTP listener (`http.port`): the Open Inference Protocol (KServe v2 REST) and each route's own
payloads, beside MQTT, served by the same intake and workers (http_calls.py says how).

The standard library's ThreadingHTTPServer, with what its defaults lack:
- TCP_NODELAY and buffered writes (`wbufsize`): as shipped, a keep-alive reply goes out as a
  headers write and a body write, and the second waits ~40 ms for the client's delayed ACK
  (Nagle); here a reply is one write, sent at once.
- HTTP/1.1 keep-alive, every answer with its Content-Length; an idle connection is closed
  after IDLE_TIMEOUT_S.
- At most `max_connections` open connections (each a thread while it lasts): one more is
  answered 503 from the accepting thread and closed.
- A request's whole time is `request_timeout_ms`, from its first byte (a connection's first
  request: from the accept, its TLS handshake included): its line, headers and body must arrive
  within it (else 408 and the connection closes; a client sending a byte at a time holds only
  its own connection, and only that long), and its answer too (else 504). So a flood of stalled
  connections holds the listener for one request timeout, not IDLE_TIMEOUT_S per read.
- A refusal before the body is read (401, 404, 413, ...) is sent, then the body is read and
  dropped (http_handler.py, http_body.py): a client that writes its whole body before reading
  gets the answer instead of a reset. A gzip or deflate body is inflated, bounded.
- Every error, the server's own included (a malformed request line), is one JSON object
  `{"error", "code", "id"}`.

Endpoints (docs/http.md): GET /v2, /v2/health/live, /v2/health/ready, /v2/models/<route>[/ready]
(also under /versions/<sha256 prefix>); POST /v2/models/<route>/infer; POST /routes/<route>.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import socket
import socketserver
import ssl
import threading
import time
from http.server import ThreadingHTTPServer
from typing import Callable, Mapping, Optional

from daemon.config.http import HttpConfig
from daemon.obs.stats import Stats
from daemon.transport import v2_codec
from daemon.transport.http_calls import Calls
from daemon.transport.http_handler import Handler, HttpRoute

logger = logging.getLogger(__name__)

class HttpListener:
    """The listener: started on its own thread, stopped first on shutdown (daemon/lifecycle/service.py)."""

    def __init__(self, config: HttpConfig, routes: Mapping[str, HttpRoute], calls: Calls, stats: Stats,
                 route_of: Callable[[str], Optional[str]], version: str = ""):
        """`route_of`: the name of the route that serves a request topic (intake's route table), so a
        device whose topic another route's filter takes first is told so instead of misrouted."""
        self.config = config
        self.routes = dict(routes)
        self.calls = calls
        self.stats = stats
        self.route_of = route_of
        self.version = version
        self.stopping = False
        self._in_flight = 0
        self._idle = threading.Condition()
        self._expected = None if config.token is None else f"Bearer {config.token}".encode()
        self._server: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None

    @property
    def port(self) -> int:
        return self._server.server_address[1] if self._server is not None else 0

    def start(self) -> None:
        context = None
        if self.config.tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(self.config.tls.cert_file), str(self.config.tls.key_file))
        self._server = _Server((self.config.address, self.config.port), self, self.config.max_connections, context)
        self._thread = threading.Thread(target=self._server.serve_forever, name="http-listener", daemon=True)
        self._thread.start()
        logger.info("HTTP listener (Open Inference Protocol v2) on %s://%s:%d", "https" if context else "http",
                    self.config.address, self.port)
        if self._expected is None and not _loopback(self.config.address):
            logger.warning("HTTP listener on %s without http.token_file: anyone who reaches it can use it",
                           self.config.address)

    def stop(self, timeout_s: float) -> None:
        """No new requests (503, connection closed), then the ones in flight answered, for up to
        `timeout_s`; then every connection is closed."""
        self.stopping = True
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._in_flight and (left := deadline - time.monotonic()) > 0:
                self._idle.wait(left)
        self._server.close_connections()
        logger.info("HTTP listener stopped")

    def authorized(self, header: Optional[str]) -> bool:
        if self._expected is None:
            return True
        return header is not None and hmac.compare_digest(header.encode("utf-8", "replace"), self._expected)

    def begin(self) -> None:
        with self._idle:
            self._in_flight += 1

    def end(self) -> None:
        with self._idle:
            self._in_flight -= 1
            self._idle.notify_all()


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # stop() closes the connections itself
    request_queue_size = 128

    def __init__(self, address: tuple, listener: HttpListener, max_connections: int,
                 context: Optional[ssl.SSLContext]):
        self.listener = listener
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self._slots = threading.BoundedSemaphore(max_connections)
        self._context = context
        self._open: set = set()
        self._lock = threading.Lock()
        super().__init__(address, Handler)

    def server_bind(self) -> None:
        """As HTTPServer's, without its `getfqdn` (a reverse DNS lookup at start-up)."""
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):
            self._refuse(request)
            return
        try:
            super().process_request(request, client_address)
        except Exception:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        with self._lock:
            self._open.add(request)
        try:
            if self._context is not None:
                request = self._context.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
            super().process_request_thread(request, client_address)
        except (OSError, ssl.SSLError) as exc:  # a failed handshake: that client's problem only
            logger.debug("HTTP connection from %s: %s", client_address[0], exc)
            self.shutdown_request(request)
        finally:
            with self._lock:
                self._open.discard(request)
            self._slots.release()

    def handle_error(self, request, client_address) -> None:
        """A connection that failed (a TLS handshake, a reset): logged, not printed to stderr as the
        stdlib does; the listener and every other connection go on."""
        logger.debug("HTTP connection from %s failed", client_address[0], exc_info=True)

    def _refuse(self, request: socket.socket) -> None:
        """Past max_connections: a short 503 from this (the accepting) thread, then closed."""
        self.listener.stats.count_http("", 503)
        if self._context is None:
            body = v2_codec.error_body("too many connections (http.max_connections)", "overloaded")
            try:
                request.settimeout(0.2)
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
                                % (len(body), body))
            except OSError:
                pass
        self.shutdown_request(request)

    def close_connections(self) -> None:
        with self._lock:
            open_now = list(self._open)
        for request in open_now:
            try:
                request.shutdown(socket.SHUT_RDWR)  # an idle keep-alive handler wakes and ends
            except OSError:
                pass

