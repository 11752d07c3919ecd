"""The stats topic's payload: one JSON object describing the node, built from the parts.

`edge-inferd/<client_id>/stats` is retained and published at start and every
`stats_interval_s` (the contract's keys: received, results, errors by code, cache, queue,
workers, models, latency_ms, reconnects, outbox, uptime_s), with floats rounded. Once a
minute the log gets `summary_line()` of it, a readable one-liner; the full object is logged
at stop (STOPPED_PREFIX, then the JSON; `stopped_stats()` reads it back from a log). The Prometheus exporter (prometheus.py) reads the same `Stats`.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping, Optional, Protocol

from daemon.obs.stats import ERROR_PREFIX, RESULTS

# The daemon's last log line on a stop: this, then its stats as one line of JSON.
STOPPED_PREFIX = "stopped; stats "
_STOPPED = re.compile(re.escape(STOPPED_PREFIX) + r"(\{.*\})")


class _Cache(Protocol):
    def snapshot(self) -> dict: ...


def payload(stats: dict, uptime_s: float, models: Mapping[str, str], workers: int,
               queue: Optional[dict] = None, cache: Optional[_Cache] = None,
               reconnects: int = 0, outbox: Optional[dict] = None, scaling: Optional[dict] = None,
               residency: Optional[Mapping[str, dict]] = None) -> dict:
    """`stats` is `Stats.snapshot()`; `models` maps each model name to its sha256; `workers` is the
    worker threads running now and `scaling` their bounds and scale-up/down counts (WorkerPool.scaling);
    `residency` (daemon/model/residency.py) adds `loaded`, `cold_starts` and `cold_start_ms` by model name."""
    counts = dict(stats.get("counts", {}))
    errors = {name[len(ERROR_PREFIX):]: n for name, n in counts.items() if name.startswith(ERROR_PREFIX)}
    latency = dict(stats.get("latency_ms", {}))
    latency["stages"] = stats.get("stages_ms", {})
    return rounded({
        "received": counts.get("received", 0),
        "results": counts.get(RESULTS, 0),
        "errors": errors,
        "counts": {name: n for name, n in counts.items() if not name.startswith(ERROR_PREFIX)},
        "cache": cache.snapshot() if cache is not None else {"enabled": False},
        "queue": queue or {},
        "workers": {"threads": workers, "busy": (queue or {}).get("busy", 0), **(scaling or {})},
        "batch_size": stats.get("batch_size", {}),
        "models": {name: {"loaded": True, "sha256": sha[:12], **(residency or {}).get(name, {})}
                   for name, sha in models.items()},
        "latency_ms": latency,
        "reconnects": reconnects,
        "outbox": outbox or {},
        "uptime_s": round(uptime_s, 1),
    })


class RequestRate:
    """`requests_per_s` of the stats topic: requests received per second since the previous publish
    (0 at the first), so that a dashboard (Home Assistant's node sensor) needs no history of its own."""

    def __init__(self) -> None:
        self._last: Optional[tuple[float, int]] = None  # (when, received) at the previous publish

    def update(self, received: int, now: float) -> float:
        last, self._last = self._last, (now, received)
        if last is None or now <= last[0]:
            return 0.0
        return round(max(0, received - last[1]) / (now - last[0]), 2)


# Decimals kept in the stats' floats: bucket bounds in ms come out as 0.010000000000000002.
_DECIMALS = 4
_PERCENT = 100.0
_ONE_DECIMAL_BELOW_MS = 100.0


def rounded(value: Any) -> Any:
    """Floats rounded to _DECIMALS, in nested dicts too."""
    if isinstance(value, float):
        return round(value, _DECIMALS)
    if isinstance(value, dict):
        return {key: rounded(item) for key, item in value.items()}
    return value


def summary_line(snapshot: Mapping[str, Any]) -> str:
    """`payload()` as one readable log line, for example `stats: received 1234, results 1230,
    errors bad_payload=4, cache hit 12%, queue 0, p50 1.2 ms p99 7.6 ms, outbox 0, reconnects 0`."""
    errors = sorted(snapshot.get("errors", {}).items(), key=lambda item: (-item[1], item[0]))
    cache = snapshot.get("cache", {})
    latency = snapshot.get("latency_ms", {})
    outbox = snapshot.get("outbox", {})
    parts = [
        f"received {snapshot.get('received', 0)}",
        f"results {snapshot.get('results', 0)}",
        "errors " + (" ".join(f"{code}={n}" for code, n in errors) if errors else "0"),
        f"cache hit {cache['hit_rate'] * _PERCENT:.0f}%" if "hit_rate" in cache else "cache off",
        f"queue {snapshot.get('queue', {}).get('depth', 0)}",
        f"p50 {_ms(latency['p50'])} ms p99 {_ms(latency['p99'])} ms" if "p50" in latency else "no latency yet",
        f"outbox {outbox.get('unconfirmed', 0) + outbox.get('stored', 0)}",
        f"reconnects {snapshot.get('reconnects', 0)}",
    ]
    return "stats: " + ", ".join(parts)


def stopped_stats(log_text: str) -> Optional[dict]:
    """The stats of the last STOPPED_PREFIX line in a daemon's log; None when it has none (it did
    not stop cleanly)."""
    found = _STOPPED.findall(log_text)
    return json.loads(found[-1]) if found else None


def _ms(value: float) -> str:
    if value < 1.0:
        return f"{value:.2f}"
    return f"{value:.1f}" if value < _ONE_DECIMAL_BELOW_MS else f"{value:.0f}"
