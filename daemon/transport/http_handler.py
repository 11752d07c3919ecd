"""One HTTP connection's requests (a thread of http_server.py's listener): parse, authorize, serve, answer.

Every answer is one buffered write (headers and body together) with its Content-Length, on a
keep-alive connection unless the request's body was left unread (then it is read and dropped
after the answer, so that the answer reaches the client: http_body.py says why). A request's whole
time, from its first byte (the connection's opening for its first request: the TLS handshake
included) to its answer, is `http.request_timeout_ms`. A request that goes through serving is
counted in the stats by route and status (`Stats.count_http`).
"""

from __future__ import annotations

import io
import logging
import socket
import time
from http.server import BaseHTTPRequestHandler
from typing import Any, Callable, NamedTuple, Optional
from urllib.parse import unquote

import orjson

from daemon import topics
from daemon.config.schema import RouteConfig
from daemon.transport import http_body, v2_codec

logger = logging.getLogger(__name__)

IDLE_TIMEOUT_S = 15.0  # a keep-alive connection with no new request for this long is closed
MIN_WRITE_S = 1.0  # an answer made at its deadline (a 408, a 504) still gets this long to leave
MAX_REQUEST_LINE = 65536  # as the stdlib's BaseHTTPRequestHandler
RETRY_AFTER_S = "1"
MAX_DEVICE_CHARS = 128
DEVICE_HEADER = "X-Device"  # names the device (the route filter's wildcard levels); default: the client's address
JSON = "application/json"
BINARY_HEADER = "Inference-Header-Content-Length"  # the v2 binary tensor extension
SERVER_NAME = "edge-inferd"
TIMEOUT = "timeout"
# A reply's error code -> the status it is answered with.
STATUS_OF = {"bad_payload": 400, "bad_shape": 400, v2_codec.BAD_REQUEST: 400, "too_large": 413,
             "rate_limited": 429, "overloaded": 503, "expired": 503, "superseded": 409, "internal": 500}
SHED = (429, 503)  # answered with Retry-After
UNAUTHORIZED = 401
HEALTH = ("v2/health/live", "v2/health/ready")  # no token needed: probes (Kubernetes, systemd, a load balancer)


class HttpRoute(NamedTuple):
    config: RouteConfig
    version: Callable[[], str]  # its model's sha256 prefix now (a hot swap changes it)


class Answer(Exception):
    """An answer made before serving: status, code and message; `close` when the body was left unread."""

    def __init__(self, status: int, code: str, message: str, close: bool = False, request_id: Any = None):
        super().__init__(message)
        self.status, self.code, self.close, self.request_id = status, code, close, request_id


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    wbufsize = -1  # buffered: headers and body leave in one write, flushed after each request
    timeout = IDLE_TIMEOUT_S
    server_version = SERVER_NAME
    sys_version = ""
    # What a request line too broken to name its version gets: the stdlib's HTTP/0.9 would send the
    # error without a status line or headers, which no client of ours could read.
    default_request_version = "HTTP/1.0"

    def setup(self) -> None:
        super().setup()
        self.listener = self.server.listener
        self._timeout_s = self.listener.config.request_timeout_ms / 1000.0
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Every read against the request's deadline (http_body.DeadlineReader), in place of the
        # stdlib's reader, whose socket timeout bounds each read alone.
        self._reader = http_body.DeadlineReader(self.connection)
        self.rfile.close()
        self.rfile = io.BufferedReader(self._reader, http_body.READ_CHUNK)
        self._started = self._reader.start(self._timeout_s)  # the first request counts from the accept
        self._pending, self._first = 0, True
        if hasattr(self.connection, "do_handshake"):  # TLS: here, on this connection's thread, bounded
            self.connection.settimeout(self._timeout_s)
            self.connection.do_handshake()

    def handle_one_request(self) -> None:
        """The stdlib's, with the request's time bounded from its first byte (a request stalled in
        its line or headers is answered 408 and closed at its deadline, not held for
        IDLE_TIMEOUT_S per read: max_connections such clients locked everyone out) and a body it
        leaves unread counted."""
        if not self._first and not self._next_request():
            self.close_connection = True
            return
        self._first, self._pending = False, 0
        # What an answer's log line reads, should the request stall inside its first line.
        self.requestline, self.request_version, self.command = "", self.default_request_version, ""
        try:
            self.raw_requestline = self.rfile.readline(MAX_REQUEST_LINE + 1)
            if len(self.raw_requestline) > MAX_REQUEST_LINE:
                self.send_error(414, "the request line is too long")
                return
            if not self.raw_requestline:
                self.close_connection = True
                return
            if not self.parse_request():  # it answered the error
                return
            self._pending = _content_length(self.headers)
            method = getattr(self, "do_" + self.command, None)
            if method is None:
                self.send_error(501, f"unsupported method ({self.command!r})")
                return
            method()
            self.wfile.flush()
        except TimeoutError:
            self.close_connection = True
            if self._reader.got:  # a request had begun: it is told why it ends
                self._send(408, v2_codec.error_body(f"the request did not arrive within "
                           f"http.request_timeout_ms ({self.listener.config.request_timeout_ms:g})", TIMEOUT),
                           close=True)

    def _next_request(self) -> bool:
        """Wait (up to IDLE_TIMEOUT_S) for a keep-alive connection's next request; its time starts
        at its first byte. False: the client closed, or sent nothing for that long."""
        self._reader.start(IDLE_TIMEOUT_S)
        try:
            if not self.rfile.peek(1):
                return False
        except OSError:  # TimeoutError included
            return False
        self._started = self._reader.start(self._timeout_s)
        return True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's signature
        logger.debug("%s %s", self.address_string(), format % args)

    def send_error(self, code: int, message: Optional[str] = None, explain: Optional[str] = None) -> None:
        """The stdlib's own errors (a malformed request line, a header too long): JSON like ours."""
        self.close_connection = True
        self._send(code, v2_codec.error_body(message or explain or "bad request", v2_codec.BAD_REQUEST),
                   close=True)

    def handle_expect_100(self) -> bool:
        """`Expect: 100-continue` (curl sends it for bodies past 1 KiB): the interim answer must leave
        now, not sit in the write buffer while the client waits (about 1 s) for it."""
        self.send_response_only(100)
        self.end_headers()
        self.wfile.flush()
        return True

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's names
        self._serve("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._serve("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._serve("PUT")

    def do_DELETE(self) -> None:  # noqa: N802
        self._serve("DELETE")

    def _serve(self, method: str) -> None:
        started = self._started
        self._route_name, status = "", 500
        self.listener.begin()
        try:
            status = self._dispatch(method, started)
        except Answer as answer:
            status = answer.status
            self._send(status, v2_codec.error_body(str(answer), answer.code, answer.request_id), close=answer.close)
        except (OSError, ValueError) as exc:  # the client went away mid-request, or sent what cannot be read
            logger.debug("HTTP request from %s failed: %s", self.address_string(), exc)
            self.close_connection = True
        except Exception:  # a handler thread must answer whatever happens, and the daemon stays up
            logger.exception("HTTP %s %s failed", method, self.path)
            status = 500
            self._send(500, v2_codec.error_body("internal error", "internal"), close=True)
        finally:
            if self.close_connection and self._pending:  # answered with its body unread: read it, so
                http_body.discard(self.rfile, self._pending)  # that the answer arrives (http_body.py)
            self.listener.end()
            self.listener.stats.count_http(self._route_name, status)

    def _dispatch(self, method: str, started: float) -> int:
        """The status once answered; raises Answer for an early error."""
        parts = [unquote(p) for p in self.path.split("?", 1)[0].strip("/").split("/")]
        path = "/".join(parts)
        if method != "POST" and self.headers.get("Content-Length", "0").strip() not in ("", "0"):
            self.close_connection = True  # a body nobody reads would be taken for the next request
        if self.listener.stopping:
            raise Answer(503, "overloaded", "shutting down", close=True)
        if path not in HEALTH and not self.listener.authorized(self.headers.get("Authorization")):
            raise Answer(UNAUTHORIZED, "unauthorized", "missing or wrong bearer token (Authorization: Bearer ...)",
                         close=method != "GET")
        if parts[:1] == ["routes"] and len(parts) == 2:
            return self._infer(self._route(parts[1], method, "POST"), started, v2=False)
        if parts[:1] != ["v2"]:
            raise Answer(404, "not_found", f"no such path: /{path}", close=method != "GET")
        return self._v2(parts[1:], method, started)

    def _v2(self, parts: list, method: str, started: float) -> int:
        if not parts:
            self._need(method, "GET")
            return self._json(200, {"name": SERVER_NAME, "version": self.listener.version, "extensions": []})
        if parts[0] == "health" and len(parts) == 2 and parts[1] in ("live", "ready"):
            self._need(method, "GET")
            ready = parts[1] == "live" or not self.listener.stopping
            return self._json(200 if ready else 503, {parts[1]: ready})
        if parts[0] != "models" or len(parts) < 2:
            raise Answer(404, "not_found", "no such path: /v2/" + "/".join(parts), close=method != "GET")
        rest = parts[2:]
        if rest[:1] == ["versions"] and len(rest) >= 2:
            version, rest = rest[1], rest[2:]
        else:
            version = None
        verb = rest[0] if len(rest) == 1 else "" if not rest else None
        if verb not in ("", "ready", "infer"):
            raise Answer(404, "not_found", "no such path: /v2/" + "/".join(parts), close=method != "GET")
        route = self._route(parts[1], method, "POST" if verb == "infer" else "GET", version)
        if verb == "infer":
            return self._infer(route, started, v2=True)
        if verb == "ready":
            return self._json(200, {"name": route.config.name, "ready": True})
        return self._json(200, v2_codec.model_metadata(route.config, route.version()))

    def _route(self, name: str, method: str, wanted: str, version: Optional[str] = None) -> HttpRoute:
        route = self.listener.routes.get(name)
        if route is None:
            raise Answer(404, "not_found", f"no route {name!r} (known: {', '.join(sorted(self.listener.routes))})",
                         close=method != "GET")
        self._route_name = name
        if version is not None and version != route.version():
            raise Answer(404, "not_found", f"route {name!r} serves version {route.version()}, not {version!r}",
                         close=method != "GET")
        self._need(method, wanted)
        return route

    @staticmethod
    def _need(method: str, wanted: str) -> None:
        if method != wanted:
            raise Answer(405, v2_codec.BAD_REQUEST, f"use {wanted} here", close=method != "GET")

    def _infer(self, route: HttpRoute, started: float, v2: bool) -> int:
        """Serve one request through intake: the v2 JSON's rows, or the route's own payload as sent."""
        timeout_s = self._timeout_s
        body = self._body()
        request = v2_codec.Infer(None, [body], None)
        if v2:
            try:
                request = v2_codec.parse_infer(body, route.config, self._header_length())
            except v2_codec.V2Error as exc:
                raise Answer(400, exc.code, str(exc), request_id=exc.request_id) from None
        request_id = request.request_id
        topic = self._topic(route.config)
        replies = self.listener.calls.serve(topic, request.payloads, started, timeout_s)
        if replies is None:
            raise Answer(504, TIMEOUT, f"no answer within http.request_timeout_ms "
                         f"({self.listener.config.request_timeout_ms:g})", request_id=request_id)
        decoded = [orjson.loads(r) for r in replies if r is not None]
        failed = next((d for d in decoded if d.get("error")), None)
        status = STATUS_OF.get(failed["error"]["code"], 500) if failed else 200
        if not v2:
            return self._send(status, replies[0])
        if failed:
            return self._send(status, v2_codec.error_body(failed["error"]["message"], failed["error"]["code"],
                                                          request_id))
        return self._json(200, v2_codec.infer_response(route.config, request_id, decoded, request.outputs))

    def _header_length(self) -> Optional[int]:
        """The binary tensor extension's JSON length (tritonclient's default), or None: all JSON."""
        value = self.headers.get(BINARY_HEADER)
        if value is None:
            return None
        try:
            return int(value)
        except ValueError:
            raise Answer(400, v2_codec.BAD_REQUEST, f"{BINARY_HEADER} must be an integer, got {value!r}") from None

    def _body(self) -> bytes:
        """The request's body by its Content-Length, all of it within the request's time (else
        408), inflated when compressed; at most http.max_body_bytes sent and inflated (else 413)."""
        limit = self.listener.config.max_body_bytes
        try:
            length, wbits = http_body.expected_length(self.headers, limit)
            body = http_body.read_exactly(self.rfile, length, self.listener.config.request_timeout_ms)
            self._pending = 0
            return http_body.inflate(body, wbits, limit)
        except http_body.Refused as refused:
            raise Answer(refused.status, refused.code, str(refused), close=refused.close) from None

    def _topic(self, route: RouteConfig) -> str:
        """The request topic of this device on the route: each wildcard level of its filter is the
        device (X-Device, else the client's address), so per-device state (min_interval_ms,
        coalesce, reuse) is kept for an HTTP client as for an MQTT device."""
        device = self.headers.get(DEVICE_HEADER) or self.client_address[0]
        if not device or len(device) > MAX_DEVICE_CHARS or any(c in device for c in "/+#\0"):
            raise Answer(400, v2_codec.BAD_REQUEST, f"{DEVICE_HEADER} must be 1..{MAX_DEVICE_CHARS} characters "
                         "without '/', '+' or '#'")
        topic = "/".join(device if level in ("+", "#") else level for level in route.subscribe.split("/"))
        if topics.match(route.subscribe, topic) is None:  # a '$' device level on a filter that starts with '+'
            raise Answer(400, v2_codec.BAD_REQUEST, f"{DEVICE_HEADER} {device!r} cannot stand in a topic")
        owner = self.listener.route_of(topic)
        if owner != route.name:
            raise Answer(400, v2_codec.BAD_REQUEST, f"this device's topic {topic!r} is served by route "
                         f"{owner!r}, whose filter comes first: send it there, or name another {DEVICE_HEADER}")
        return topic

    def _json(self, status: int, body: dict) -> int:
        return self._send(status, orjson.dumps(body))

    def _send(self, status: int, body: bytes, close: bool = False) -> int:
        # The answer leaves within the request's time too: a client that stops reading holds its
        # connection no longer than one that stops sending.
        self.connection.settimeout(max(self._reader.deadline - time.monotonic(), MIN_WRITE_S))
        self.send_response(status)
        self.send_header("Content-Type", JSON)
        self.send_header("Content-Length", str(len(body)))
        if status in SHED:
            self.send_header("Retry-After", RETRY_AFTER_S)
        elif status == UNAUTHORIZED:
            self.send_header("WWW-Authenticate", 'Bearer realm="edge-inferd"')  # RFC 6750
        if close:
            self.close_connection = True
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()  # one write, now: before stop() may close the connection once we are done
        return status


def _content_length(headers) -> int:
    """The body's announced length (0 when none or unreadable: nothing to read after a refusal)."""
    try:
        return max(0, int(headers.get("Content-Length", "0")))
    except ValueError:
        return 0
