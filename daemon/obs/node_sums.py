"""The node's stats when `workers.processes` > 1: the children's stats (daemon/obs/stats_topic.py
`stats_topic.payload`, read from their heartbeats) summed into one object with the contract's keys.

Counters (received, results, errors by code, counts, cache hits and misses, reconnects,
outbox dropped and flushed) are sums, including what restarted children counted before
(their last heartbeat, so a SIGKILLed child's last second may be missing): a child's ended
incarnations are folded into one running total (`fold`), so that total stays one dict
however often it restarts. Levels (queue, busy threads, cache entries and bytes, outbox rows
and bytes) are the live children's only: they end with the process. Latency percentiles
cannot be summed: `latency_ms` is the worst child's of each, and so is each route's `drift` (the
child whose window drifts most; each child watches its own share of the requests). `workers` says `processes`;
`children` lists each child's received, results, restarts and ready.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

_SUMMED = ("received", "results", "reconnects")
_CACHE_COUNTERS = ("hits", "disk_hits", "misses", "admitted", "refused", "writes", "write_batches", "dropped_writes")
_CACHE_SUMMED = ("entries", "bytes", *_CACHE_COUNTERS)
_OUTBOX_COUNTERS = ("dropped", "flushed")
_LATENCY_KEYS = ("p50", "p99")  # what daemon/obs/stats.py reports


def _add(into: dict, counts: Mapping[str, Any]) -> None:
    for key, value in counts.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            into[key] = into.get(key, 0) + value


def fold(total: Mapping[str, Any], stats: Mapping[str, Any]) -> dict:
    """An ended incarnation's last stats added to its child's earlier total: counters only."""
    out: dict = {key: total.get(key, 0) + stats.get(key, 0) for key in _SUMMED}
    for section, keys in (("errors", None), ("counts", None), ("cache", _CACHE_COUNTERS),
                          ("outbox", _OUTBOX_COUNTERS)):
        if section == "cache" and "hits" not in stats.get("cache", {}) and "cache" not in total:
            continue  # the cache was off: nothing to add up
        out[section] = dict(total.get(section, {}))
        _add(out[section], {k: v for k, v in stats.get(section, {}).items() if keys is None or k in keys})
    return out


def summed(children: Mapping[str, Mapping[str, Any]], uptime_s: float) -> dict:
    """`children`: name -> {"stats": latest, "past": its ended incarnations `fold`ed (or {}), "restarts",
    "ready"}."""
    every = [s for c in children.values() for s in (c.get("stats") or {}, c.get("past") or {})]
    out: dict = {key: sum(s.get(key, 0) for s in every) for key in _SUMMED}
    errors: dict = {}
    counts: dict = {}
    queue: dict = {}
    outbox: dict = {}
    for s in every:
        _add(errors, s.get("errors", {}))
        _add(counts, s.get("counts", {}))
        _add(outbox, s.get("outbox", {}))
    current = [c.get("stats") or {} for c in children.values()]
    for s in current:
        _add(queue, s.get("queue", {}))
    out.update(errors=errors, counts=counts, cache=_cache(every), queue=queue, outbox=outbox,
               latency_ms=_worst_latency(current), uptime_s=round(uptime_s, 1))
    out["workers"] = {"processes": len(children), "threads": sum(s.get("workers", {}).get("threads", 0)
                                                               for s in current),
                      "busy": sum(s.get("workers", {}).get("busy", 0) for s in current)}
    out["models"] = next((s["models"] for s in current if s.get("models")), {})
    drift = _worst_drift(current)
    if drift:
        out["drift"] = drift
    out["children"] = {name: {"received": (c.get("stats") or {}).get("received", 0),
                              "results": (c.get("stats") or {}).get("results", 0),
                              "restarts": c.get("restarts", 0), "ready": bool(c.get("ready"))}
                       for name, c in children.items()}
    return out


def _cache(stats: Iterable[Mapping[str, Any]]) -> dict:
    caches = [s["cache"] for s in stats if s.get("cache", {}).get("enabled", True) and "hits" in s.get("cache", {})]
    if not caches:
        return {"enabled": False}
    out = {key: sum(c.get(key, 0) for c in caches) for key in _CACHE_SUMMED}
    total = out["hits"] + out["disk_hits"] + out["misses"]
    out["hit_rate"] = round((out["hits"] + out["disk_hits"]) / total, 4) if total else 0.0
    return out


def _worst_latency(stats: Iterable[Mapping[str, Any]]) -> dict:
    worst: dict = {}
    for s in stats:
        for key, value in s.get("latency_ms", {}).items():
            if key in _LATENCY_KEYS and isinstance(value, (int, float)):
                worst[key] = max(worst.get(key, 0), value)
    return worst


def _worst_drift(stats: Iterable[Mapping[str, Any]]) -> dict:
    """Per route, the drift state of the child with the highest PSI (a PSI of null counts as -1)."""
    worst: dict = {}
    for s in stats:
        for route, state in (s.get("drift") or {}).items():
            mine = state.get("psi_max")
            theirs = worst.get(route, {}).get("psi_max")
            if route not in worst or (mine if mine is not None else -1) > (theirs if theirs is not None else -1):
                worst[route] = state
    return worst
