"""The service's HTTP listener (`http.port`), made as the config says and joined to serving.

`open_listener` attaches a `Switchboard` (daemon/transport/http_calls.py) as serving's transport
in place of the bare MQTT link: replies to HTTP requests go to their waiting handlers, every
other reply, ack and publish to the link. Started as the last step, once intake is open,
and stopped first, so the requests it has in flight are answered by workers that still run.
"""

from __future__ import annotations

from typing import Callable, Optional

from daemon import __version__
from daemon.config.schema import Config
from daemon.obs.stats import Stats
from daemon.serve.wiring import Serving
from daemon.transport.http_calls import Calls, Switchboard
from daemon.transport.http_handler import HttpRoute
from daemon.transport.http_server import HttpListener

# stop() waits this much past http.request_timeout_ms for the requests in flight to be answered.
STOP_MARGIN_S = 0.5


def open_listener(config: Config, serving: Serving, link: object, stats: Stats,
                  version_of: Callable[[str], str]) -> HttpListener:
    """The listener (started), its requests handed to serving's intake. `version_of`: a model's
    sha256 prefix now (read per request: a hot swap changes it)."""
    calls = Calls(serving.intake.on_burst)
    serving.attach(Switchboard(link, calls))
    routes = {r.name: HttpRoute(r, _version(version_of, r.model)) for r in config.routes}
    listener = HttpListener(config.http, routes, calls, stats, lambda topic: _route_of(serving, topic), __version__)
    listener.start()
    return listener


def stop_listener(listener: Optional[HttpListener], config: Config) -> None:
    """No new requests; those in flight answered (up to their timeout); the connections closed. The
    switchboard stays attached: a reply that comes later is dropped (counted as late)."""
    if listener is not None:
        listener.stop(config.http.request_timeout_ms / 1000.0 + STOP_MARGIN_S)


def _version(version_of: Callable[[str], str], model: str) -> Callable[[], str]:
    return lambda: version_of(model)


def _route_of(serving: Serving, topic: str) -> Optional[str]:
    found = serving.routes.find(topic)
    return found[0].route.name if found is not None else None
