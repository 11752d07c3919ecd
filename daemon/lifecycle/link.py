"""The service's MQTT link, made as the config says: paho or the native link, its window, its outbox.

`open_link` hands the link what it needs of serving: the topic filters, the intake's burst
callback, and the admission's byte budget (a full one stops reading). Serving gets the link
back as its transport, for replies and acks.
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Optional, Sequence

from daemon.config.mqtt import NATIVE
from daemon.config.schema import Config, WorkersConfig
from daemon.serve.wiring import Serving
from daemon.transport.mqtt import MqttLink
from daemon.transport.outbox import Outbox

logger = logging.getLogger(__name__)

# Requests in flight to us at most (see receive_maximum).
RECEIVE_MAXIMUM_CAP = 1024
# The smallest request we expect, for turning the byte budget into a message count.
SMALL_REQUEST_BYTES = 1024
_MIB = 1024 * 1024


def receive_maximum(workers: WorkersConfig) -> int:
    """The MQTT v5 ReceiveMaximum: requests the broker may have in flight to us, unacked.

    Bounded, not as high as MQTT allows. Requests are acked only once their reply's
    PUBACK is back, and mosquitto walks a client's in-flight list for each PUBACK: with
    65,535 allowed, an overload piled up tens of thousands in flight and the broker
    stalled (2,302 of 75,200 requests answered at 2x capacity, against 67,337 of 69,584
    with 1,024; docs/performance.md). Beyond this window a burst waits in the broker's
    queue, so `max_queued_messages` must hold it (mosquitto silently drops past its
    default of 1,000; the README says so). A byte budget smaller than the window lowers it.
    """
    return max(1, min(RECEIVE_MAXIMUM_CAP, workers.queue_bytes // SMALL_REQUEST_BYTES))


def open_link(config: Config, serving: Serving, filters: Sequence[str]) -> MqttLink:
    """The link (not started), attached to serving as its transport."""
    options: dict = {"receive_maximum": receive_maximum(config.workers), "outbox": open_outbox(config),
                     "largest_request": max((r.input.max_bytes for r in config.routes), default=0),
                     "may_read": serving.admission.has_room}  # a full byte budget stops reading
    link_type = MqttLink
    if config.mqtt.transport == NATIVE:  # imported only when chosen: mqtt5 has no wheel everywhere
        from daemon.transport.native import NativeLink as link_type
    link = link_type(config.mqtt, filters, serving.intake.on_burst, **options)
    serving.attach(link)
    return link


def open_outbox(config: Config) -> Optional[Outbox]:
    """The on-disk outbox, or None (turned off, or it cannot be opened: replies then wait
    in paho's memory while the broker is away, and are lost if the daemon stops meanwhile)."""
    outbox = config.mqtt.outbox
    if outbox.max_mb <= 0:
        return None
    try:
        return Outbox(outbox.dir, int(outbox.max_mb * _MIB))
    except (OSError, sqlite3.Error) as exc:
        logger.warning("mqtt.outbox: cannot open %s (%s); serving without an on-disk outbox", outbox.dir, exc)
        return None
