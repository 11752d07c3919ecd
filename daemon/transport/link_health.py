"""What the MQTT link's connects and drops say, in words a user can act on.

- A failed connect is logged with its cause (refused, unreachable, DNS, TLS) and the
  next retry delay, at most once per interval with the count of attempts in between.
- A refused CONNACK names the reason; bad credentials point at the keys to check.
- Two clients with one client id: the broker disconnects the older one whenever the
  other connects. A v5 DISCONNECT "Session taken over" names it; mosquitto 2.0 just
  closes the socket, so connections that keep dropping right after a successful connect
  are reported as a suspected client-id clash.
"""

from __future__ import annotations

import errno
import logging
import socket
import ssl
import time
from collections import deque
from typing import Callable, Optional

from daemon.obs.throttled_log import ThrottledLog

logger = logging.getLogger(__name__)

# v5 DISCONNECT reason "Session taken over": another client connected with our client id.
SESSION_TAKEN_OVER = 0x8E
# CONNACK reason codes (3.1.1 and v5) that refuse the credentials or the client id.
AUTH_CODES = {0x04: "bad user name or password", 0x05: "not authorized", 0x85: "client id not valid",
              0x86: "bad user name or password", 0x87: "not authorized", 0x8C: "bad authentication method"}
# v5 DISCONNECT reasons a broker gives for what the daemon asked of it, with what to do. A
# drop with a reason code is not a suspected client-id clash (ejabberd answers a `$share`
# SUBSCRIBE with DISCONNECT 0x9E, and its reconnect loop looked like one).
UNSPECIFIED = 0x80
BROKER_REASONS = {
    0x87: "check the broker's ACL for the daemon's subscriptions and reply topics",
    0x95: "a reply is larger than the broker takes (its maximum packet or payload size)",
    0x97: "the broker's quota for this client is exceeded",
    0x9E: "the broker has no shared subscriptions: remove mqtt.share_group, or use a broker that has them",
    0xA2: "the broker has no wildcard subscriptions: routes must subscribe to plain topics",
}
# Other DISCONNECT reasons only a server sends (not 0x80-0x82, nor 0x8D "Keep alive timeout",
# which paho reports for its own keepalive detection): server busy or shutting down, another
# server, receive maximum or quota exceeded, rates, administrative action, unsupported features.
SERVER_REASONS = {0x89, 0x8B, 0x93, 0x94, 0x96, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F, 0xA0, 0xA1}
# Connections that drop this soon after CONNACK, CLASH_DROPS times within CLASH_WINDOW_S:
# the signature of two clients sharing one client id.
SHORT_CONNECTION_S = 10.0
CLASH_DROPS = 3
CLASH_WINDOW_S = 60.0


def connect_cause(error: Optional[BaseException], host: str, port: int) -> str:
    """Why a connect failed: refused, unreachable, DNS or TLS (auth comes back as a CONNACK)."""
    if error is None:
        return "unknown error"
    if isinstance(error, ssl.SSLCertVerificationError):
        return f"TLS: the broker's certificate was not accepted: {error.reason} ({error.verify_message})"
    if isinstance(error, ssl.SSLError):
        return f"TLS: {error.reason or error}"
    if isinstance(error, socket.gaierror):
        return f"DNS: cannot resolve {host!r} ({error.strerror})"
    if isinstance(error, ConnectionRefusedError):
        return f"refused: nothing accepts connections on port {port} (is the broker running?)"
    if isinstance(error, (TimeoutError, socket.timeout)):
        return "unreachable: timed out"
    if getattr(error, "errno", None) in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN):
        return f"unreachable: {error.strerror}"
    return f"{type(error).__name__}: {error}"


class LinkHealth:
    """Fed by the link's callbacks (paho's thread); logs what they mean, throttled."""

    def __init__(self, broker: str, client_id: str, retry_min_s: int, retry_max_s: int,
                 clock: Callable[[], float] = time.monotonic):
        self._broker, self._client_id = broker, client_id
        self._retry = (retry_min_s, retry_max_s)
        self._clock = clock
        self._log = ThrottledLog(logger, clock=clock)  # one line per kind of problem per interval
        self._failures = 0
        self._connected_at: Optional[float] = None
        self._short_drops: deque[float] = deque()

    def next_retry_s(self) -> int:
        """paho's delay before the next attempt: the minimum, doubled per failure, capped."""
        low, high = self._retry
        return min(low * 2 ** max(0, self._failures - 1), high)

    def connect_failed(self, error: Optional[BaseException], host: str, port: int) -> None:
        self._failures += 1
        self._log.warning("connect", "cannot connect to %s: %s; next try in %d s (attempt %d)", self._broker,
                          connect_cause(error, host, port), self.next_retry_s(), self._failures)

    def refused(self, code: int, reason: object) -> None:
        """A CONNACK with a failure reason code: the broker answered, and said no."""
        self._failures += 1
        hint = " (check mqtt.username and the password)" if code in AUTH_CODES else ""
        self._log.warning("refused", "broker %s refused the connection: %s%s; next try in %d s", self._broker,
                          reason, hint, self.next_retry_s())

    def connected(self) -> None:
        self._failures = 0
        self._connected_at = self._clock()

    def dropped(self, code: int, reason: object) -> None:
        """The connection was lost (not by us): a takeover, a suspected id clash, or just a drop."""
        now = self._clock()
        lasted = None if self._connected_at is None else now - self._connected_at
        self._connected_at = None
        if code == SESSION_TAKEN_OVER:
            self._log.warning("clash", "session taken over: another client connected to %s with client_id %r; "
                              "give every daemon its own mqtt.client_id", self._broker, self._client_id)
            return
        if code in BROKER_REASONS or code in SERVER_REASONS:
            self._log.warning("reason", "broker %s disconnected the daemon: %s (reason 0x%02X)%s; reconnecting",
                            self._broker, reason, code,
                            f"; {BROKER_REASONS[code]}" if code in BROKER_REASONS else "")
            return
        if lasted is not None and lasted < SHORT_CONNECTION_S:
            self._short_drops.append(now)
        while self._short_drops and now - self._short_drops[0] > CLASH_WINDOW_S:
            self._short_drops.popleft()
        if len(self._short_drops) >= CLASH_DROPS:
            self._log.warning("clash", "the connection to %s dropped %d times within %.0f s, each soon after "
                              "connecting: another client is probably using client_id %r (the broker disconnects "
                              "the older of two); give every daemon its own mqtt.client_id", self._broker,
                              len(self._short_drops), CLASH_WINDOW_S, self._client_id)
            return
        self._log.warning("dropped", "disconnected from %s (%s); reconnecting", self._broker, reason)
