"""What the broker's CONNACK grants below what the daemon asked for or needs, as log lines.

A broker may keep the session shorter than `mqtt.session_expiry_s` (ejabberd caps it at 5
minutes), not keep it at all across a reconnect, say it has no shared subscriptions, take
fewer replies in flight than the daemon's window (its ReceiveMaximum), or take packets
smaller than the requests a route accepts (its Maximum Packet Size: a larger request is
refused at the publisher, a larger reply at the daemon). None of it stops the daemon; each
becomes one clear line, logged when first seen and again only when it changes. A refused
`$share` subscription (SUBACK 0x9E) is logged by the link (LinkCommon._subscribed).

Both links turn their CONNACK into `Grants`; 3.1.1 has no properties, so only
`session_present` says anything there.
"""

from __future__ import annotations

import logging
from typing import NamedTuple, Optional

from daemon.config.mqtt import MqttConfig

logger = logging.getLogger(__name__)

# MQTT v5's default ReceiveMaximum when the CONNACK carries none.
NO_RECEIVE_LIMIT = 65535


class Grants(NamedTuple):
    """One CONNACK's answer to the daemon's CONNECT."""

    session_present: bool
    session_expiry_s: Optional[int] = None  # None: the broker took the interval the daemon asked for
    receive_maximum: int = NO_RECEIVE_LIMIT
    maximum_packet_size: Optional[int] = None  # None: no limit announced
    shared_subscriptions: bool = True


class GrantLog:
    """Compares each CONNACK with the config and the largest request the routes accept; logs the shortfalls."""

    def __init__(self, config: MqttConfig, window: int, largest_request: int = 0):
        """`window`: replies the daemon keeps in flight; `largest_request`: the largest request
        payload any route accepts (its `input.max_bytes`), 0 when unknown."""
        self._config = config
        self._window = window
        self._largest_request = largest_request
        self._said: dict[str, str] = {}
        self._connected_before = False

    def connack(self, grants: Grants) -> None:
        config, reconnect, self._connected_before = self._config, self._connected_before, True
        if config.persistent and reconnect and not grants.session_present:
            logger.warning("broker %s did not keep this daemon's session across the reconnect: requests "
                           "published while it was away were not kept for it", config.url)
        if config.is_v5:
            self._session(grants.session_expiry_s)
            self._shared(grants.shared_subscriptions)
            self._window_cap(grants.receive_maximum)
            self._packet_cap(grants.maximum_packet_size)

    def _once(self, key: str, level: int, message: str, *args: object) -> None:
        text = message % args
        if self._said.get(key) != text:
            self._said[key] = text
            logger.log(level, "%s", text)

    def _session(self, granted: Optional[int]) -> None:
        asked = self._config.session_expiry_s if self._config.persistent else 0
        if granted is not None and granted < asked:
            self._once("session", logging.WARNING,
                       "broker %s keeps this daemon's session %d s after a disconnect, not the %d s asked "
                       "(mqtt.session_expiry_s): requests published while the daemon is away longer are lost "
                       "to it", self._config.url, granted, asked)

    def _shared(self, available: bool) -> None:
        if self._config.share_group is not None and not available:
            self._once("shared", logging.ERROR,
                       "broker %s has no shared subscriptions (CONNACK: Shared Subscription Available 0): "
                       "mqtt.share_group %r will be refused", self._config.url, self._config.share_group)

    def _window_cap(self, receive_maximum: int) -> None:
        if receive_maximum < self._window:
            self._once("window", logging.INFO,
                       "broker %s takes %d replies in flight (its ReceiveMaximum; the daemon's window is %d): "
                       "further replies wait for PUBACKs", self._config.url, receive_maximum, self._window)

    def _packet_cap(self, maximum: Optional[int]) -> None:
        if maximum is not None and maximum < self._largest_request:
            self._once("packet", logging.WARNING,
                       "broker %s takes packets of at most %d bytes (its Maximum Packet Size), and a route "
                       "accepts requests of up to %d (input.max_bytes): larger requests never reach the "
                       "daemon, and a reply larger than that is refused", self._config.url, maximum,
                       self._largest_request)
