"""The stats topic's payload: one JSON object describing the node, built from the parts.

`edge-inferd/<client_id>/stats` is retained and published at start and every
`stats_interval_s` (the contract's keys: received, results, errors by code, cache, queue,
workers, models, latency_ms, reconnects, outbox, uptime_s). The same object goes to the
log, once a minute. The Prometheus exporter (prometheus.py) reads the same `Stats`.
"""

from __future__ import annotations

from typing import Mapping, Optional, Protocol

from daemon.stats import ERROR_PREFIX, RESULTS


class _Cache(Protocol):
    def snapshot(self) -> dict: ...


def node_stats(stats: dict, uptime_s: float, models: Mapping[str, str], workers: int,
               queue: Optional[dict] = None, cache: Optional[_Cache] = None,
               reconnects: int = 0, outbox: Optional[dict] = None) -> dict:
    """`stats` is `Stats.snapshot()`; `models` maps each model name to its sha256."""
    counts = dict(stats.get("counts", {}))
    errors = {name[len(ERROR_PREFIX):]: n for name, n in counts.items() if name.startswith(ERROR_PREFIX)}
    latency = dict(stats.get("latency_ms", {}))
    latency["stages"] = stats.get("stages_ms", {})
    return {
        "received": counts.get("received", 0),
        "results": counts.get(RESULTS, 0),
        "errors": errors,
        "counts": {name: n for name, n in counts.items() if not name.startswith(ERROR_PREFIX)},
        "cache": cache.snapshot() if cache is not None else {"enabled": False},
        "queue": queue or {},
        "workers": {"threads": workers, "busy": (queue or {}).get("busy", 0)},
        "batch_size": stats.get("batch_size", {}),
        "models": {name: {"loaded": True, "sha256": sha[:12]} for name, sha in models.items()},
        "latency_ms": latency,
        "reconnects": reconnects,
        "outbox": outbox or {},
        "uptime_s": round(uptime_s, 1),
    }
