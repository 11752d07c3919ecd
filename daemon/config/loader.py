"""Reads a config file into the frozen schema, validated in two passes.

Pass 1 (shape) reads each section: unknown keys, wrong types, out-of-range values.
Pass 2 (cross-field, check.py) checks what needs several sections or the disk: routes naming
unknown models, duplicate names and filters, templates against filters, model and
label files, and each route's input shape through its preprocessing against the model.
Every problem is collected and raised at once as `ConfigError` with lines of the form
`key.path: message (line N)`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Mapping, Optional

from daemon import topics
from daemon.config.check import cross_check
from daemon.config.drift import read_drift
from daemon.config.escalate import read_escalate
from daemon.config.fleet import FleetConfig, current_release, read_fleet
from daemon.config.homeassistant import read_homeassistant
from daemon.config.http import read_http
from daemon.config.mqtt import PORT_LIMIT, MqttConfig, read_mqtt
from daemon.config.reader import Reader, field_names, load_yaml, optional_float, read_steps, systemd_base
from daemon.config.reuse import read_reuse
from daemon.config.stream import read_stream
from daemon.config.then import read_then
from daemon.config.stages import read_stages
from daemon.config.anchors import ANCHOR_DECODE_KEYS, read_anchor_decode
from daemon.config.schema import (ANOMALY, CLASSIFY, COALESCE_CHOICES, DECODE_MODES, DEFAULT_MAX_BYTES, DEFAULT_MAX_PIXELS,
                                  DEFAULT_MAX_RESULTS, DEFAULT_MIN_SCORE, DEFAULT_THREADS, DEFAULT_TOP_K, DETECT,
                                  INPUT_DTYPES, INPUT_FORMATS, MAX_SAMPLE_RATE, MIN_QUEUE_MB, MIN_SAMPLE_RATE,
                                  MIN_STATS_INTERVAL_S, OUTPUT_KINDS, PCM16, PCM16_DTYPE,
                                  RESIZE_MODES, STRETCH, BatchingConfig, CacheConfig, Config, InputConfig,
                                  MetricsConfig, ModelConfig, RouteConfig, VALUES, WorkersConfig)
from daemon.errors import ConfigError
from daemon.model.runtime import RUNTIME_CHOICES


def load_config(path: Path | str, check_models: bool | Callable[[Config], bool] = True) -> Config:
    """Read, validate and freeze a config file; ConfigError lists every problem. `check_models`
    may depend on the config itself (the daemon's parent checks them only when it serves)."""
    path = Path(path)
    raw, problems = load_yaml(path)
    reader = Reader(raw, problems)
    base = path.resolve().parent
    config = _read_config(reader, base, path)
    if callable(check_models):
        check_models = check_models(config)
    cross_check(reader, config, check_models)  # on whatever pass 1 left standing: every mistake in one run
    if reader.errors:
        raise ConfigError(sorted(reader.errors, key=_line_of))
    return config


def _line_of(error: str) -> int:
    """The `(line N)` an error ends with (0 for none): errors are listed in file order."""
    _, found, rest = error.rpartition(" (line ")
    return int(rest[:-1]) if found and rest[:-1].isdigit() else 0


def _read_config(r: Reader, base: Path, path: Path) -> Config:
    root = r.section(r.raw, "", ("mqtt", "runtime", "xnnpack", "models", "routes", "cache", "workers",
                                         "batching", "stats_interval_s", "metrics", "drift",
                                         "homeassistant", "http", "fleet"), required=True)
    if not isinstance(r.raw, dict):  # an empty file, or a list: nothing else to read
        raise ConfigError(r.errors)
    runtime = r.get(root, "runtime", "", str, "auto", choices=RUNTIME_CHOICES)
    fleet = read_fleet(r, root, base)
    return Config(
        mqtt=read_mqtt(r, r.section(root, "mqtt", MqttConfig), base),
        runtime=runtime,
        models=MappingProxyType(_managed_files(r, root, _read_models(r, root, base), fleet)),
        routes=_read_routes(r, root, base),
        cache=_read_cache(r, r.section(root, "cache", CacheConfig), base),
        workers=_read_workers(r, r.section(root, "workers", (*field_names(WorkersConfig), "queue"))),
        batching=_read_batching(r, r.section(root, "batching", BatchingConfig)),
        xnnpack=r.get(root, "xnnpack", "", bool, True),
        stats_interval_s=r.get(root, "stats_interval_s", "", (int, float), 10.0, minimum=MIN_STATS_INTERVAL_S),
        metrics=_read_metrics(r, r.section(root, "metrics", MetricsConfig)),
        drift=read_drift(r, root),
        homeassistant=read_homeassistant(r, root),
        http=read_http(r, root, base),
        fleet=fleet,
        source=path,
    )


def _read_models(r: Reader, root: Mapping, base: Path) -> dict[str, ModelConfig]:
    models = r.get(root, "models", "", dict, None, required=True) or {}
    out = {}
    for name, m in models.items():
        p = f"models.{name}"
        m = r.section(models, name, ("path", "labels", "sha256", "threads", "managed", "max_batch"), path=p, required=True)
        model_path = r.get(m, "path", p, str, "", required=True)
        labels = r.get(m, "labels", p, (str, type(None)), None)
        digest = r.get(m, "sha256", p, (str, type(None)), None)
        if digest is not None and (len(digest) != 64 or any(c not in "0123456789abcdefABCDEF" for c in digest)):
            r.error(m, "sha256", p, "must be 64 hex digits")
        threads = r.get(m, "threads", p, int, DEFAULT_THREADS, minimum=1)
        managed = r.get(m, "managed", p, bool, False)
        out[str(name)] = ModelConfig(str(name), base / model_path, None if labels is None else base / labels,
                                     digest, threads, managed,
                                     max_batch=r.get(m, "max_batch", p, (int, type(None)), None, minimum=1))
    return out


def _managed_files(r: Reader, root: Mapping, models: dict[str, ModelConfig], fleet: FleetConfig) -> dict:
    """Managed models serve the store's current release (daemon/fleet/node/store.py), pinned to its
    manifest's sha256; before the first one, the configured files."""
    raw = root.get("models") if isinstance(root.get("models"), dict) else {}
    for name, mc in models.items():
        if not mc.managed:
            continue
        if not fleet.enabled:
            r.error(raw.get(name, {}), "managed", f"models.{name}", "needs fleet.enabled: true (nothing would "
                    "deliver it)")
            continue
        if mc.sha256 is not None:
            r.error(raw.get(name, {}), "sha256", f"models.{name}", "a managed model is pinned by its release's "
                    "signed manifest: leave sha256 out")
        found = current_release(fleet.store_dir, name)
        if found is not None:
            models[name] = replace(mc, path=found.model_path, labels=found.labels_path or mc.labels,
                                   sha256=found.model_sha256, release=found.serial)
    return models


def _read_routes(r: Reader, root: Mapping, base: Path) -> tuple[RouteConfig, ...]:
    routes = r.get(root, "routes", "", list, None, required=True) or []
    if not routes and "routes" in root:
        r.error(root, "routes", "", "must list at least one route")
    return tuple(route for i, item in enumerate(routes) if (route := _read_route(r, routes, i, base)) is not None)


def _read_route(r: Reader, routes: list, i: int, base: Path) -> Optional[RouteConfig]:
    p = f"routes[{i}]"
    m = r.section(routes, i, ("name", "subscribe", "model", "input", "preprocess", "output", "publish", "validate",
                              "min_interval_ms", "coalesce", "reuse",
                              "escalate", "cache", "then", "stages", "publish_stages"),
                  path=p, required=True)
    subscribe = r.get(m, "subscribe", p, str, "", required=True)
    if subscribe and (err := topics.filter_error(subscribe)):
        r.error(m, "subscribe", p, err)
    publish = r.get(m, "publish", p, str, "", required=True)
    # Placeholders count the filter's '+' levels: a broken filter has none to count.
    captures = topics.wildcard_count(subscribe) if r.ok(f"{p}.subscribe") else None
    if publish and (err := topics.template_error(publish, captures)):
        r.error(m, "publish", p, err)
    output = _read_output(r, m, p)
    gate = r.section(m, "validate", ("data", "min_accuracy", "min_roc_auc", "max_mae"), path=f"{p}.validate")
    data = r.get(gate, "data", f"{p}.validate", str, None, required=bool(gate))
    if data is not None and not (base / data).is_file():
        r.error(gate, "data", f"{p}.validate", f"{base / data}: file not found")
    spec = _read_input(r, r.section(m, "input", InputConfig, path=f"{p}.input", required=True), f"{p}.input")
    for key in ("min_interval_ms", "coalesce"):
        if spec.stream is not None and key in m:
            r.error(m, key, p, "does not apply to a stream route: each message carries samples, not a request")
    return RouteConfig(
        name=r.get(m, "name", p, str, "", required=True),
        subscribe=subscribe,
        model=r.get(m, "model", p, str, "", required=True),
        input=spec,
        preprocess=read_steps(r, m, p, spec.sample_rate),
        publish=publish,
        validate_data=None if data is None else base / data,
        min_accuracy=r.get(gate, "min_accuracy", f"{p}.validate", float, 0.0, minimum=0),
        min_roc_auc=r.get(gate, "min_roc_auc", f"{p}.validate", float, 0.0, minimum=0),
        max_mae=r.get(gate, "max_mae", f"{p}.validate", (int, float, type(None)), None, minimum=0),
        **output,
        min_interval_ms=r.get(m, "min_interval_ms", p, float, 0.0, minimum=0),
        coalesce=r.get(m, "coalesce", p, (str, type(None)), None, choices=(*COALESCE_CHOICES, None)),
        reuse=read_reuse(r, m, p),
        cache=r.get(m, "cache", p, (bool, type(None)), None),
        escalate=read_escalate(r, m, p, captures, base, spec.sample_rate),
        then=read_then(r, m, p),
        stages=read_stages(r, m, p),
        publish_stages=r.get(m, "publish_stages", p, bool, False),
    )


# Output keys that only one kind reads: given for another kind, they are a mistake worth naming.
_KIND_KEYS = {"top_k": CLASSIFY, "min_score": DETECT, "max_results": DETECT, "threshold": ANOMALY,
              "outputs": VALUES, **{key: DETECT for key in ANCHOR_DECODE_KEYS}}


def _read_output(r: Reader, m: Mapping, p: str) -> dict:
    """routes[i].output: the kind and the keys it reads, as RouteConfig fields."""
    p = f"{p}.output"
    o = r.section(m, "output", ("kind", *_KIND_KEYS), path=p)
    kind = r.get(o, "kind", p, str, CLASSIFY, choices=OUTPUT_KINDS)
    for key, owner in _KIND_KEYS.items():
        if key in o and kind != owner and r.ok(f"{p}.kind"):
            r.error(o, key, p, f"applies to kind {owner}, not {kind}")
    return {
        "kind": kind,
        "top_k": r.get(o, "top_k", p, int, DEFAULT_TOP_K, minimum=1),
        "min_score": float(r.get(o, "min_score", p, (int, float), DEFAULT_MIN_SCORE, minimum=0)),
        "max_results": r.get(o, "max_results", p, int, DEFAULT_MAX_RESULTS, minimum=1),
        "threshold": optional_float(r.get(o, "threshold", p, (int, float, type(None)), None, minimum=0)),
        "outputs": _read_output_names(r, o, p),
        "anchor_decode": read_anchor_decode(r, o, p) if kind == DETECT else None,
    }


def _read_output_names(r: Reader, o: Mapping, p: str) -> tuple[str, ...]:
    """output.outputs: a list of distinct output names (checked against the model in pass 2)."""
    names = r.get(o, "outputs", p, list, [])
    if not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
        r.error(o, "outputs", p, f"must be a list of distinct output names, got {names!r}")
        return ()
    return tuple(names)


def _read_input(r: Reader, m: Mapping, p: str) -> InputConfig:
    shape = r.get(m, "shape", p, list, [], required=True)
    if "shape" in m and not (shape and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in shape)):
        r.error(m, "shape", p, f"must be a non-empty list of positive integers, got {shape!r}")
        shape = []
    fmt = r.get(m, "format", p, str, "json", choices=INPUT_FORMATS)
    if fmt == "image" and shape and (len(shape) not in (2, 3) or (len(shape) == 3 and shape[2] not in (1, 3))):
        r.error(m, "shape", p, f"an image route takes [height, width, 3] (RGB) or [height, width, 1] / "
                f"[height, width] (grayscale), not {shape!r}")
    for key in ("resize", "max_pixels", "decode"):
        if key in m and fmt != "image" and r.ok(f"{p}.format"):
            r.error(m, key, p, "applies to format image only")
    return InputConfig(
        format=fmt,
        shape=tuple(shape or ()),
        dtype=PCM16_DTYPE if fmt == PCM16 else r.get(m, "dtype", p, str, "float32", choices=INPUT_DTYPES),
        sample_rate=_read_sample_rate(r, m, p, fmt, shape),
        max_bytes=r.get(m, "max_bytes", p, int, DEFAULT_MAX_BYTES, minimum=1),
        resize=r.get(m, "resize", p, str, STRETCH, choices=RESIZE_MODES),
        max_pixels=r.get(m, "max_pixels", p, int, DEFAULT_MAX_PIXELS, minimum=1),
        decode=r.get(m, "decode", p, str, "fast", choices=DECODE_MODES),
        stream=read_stream(r, m, p, fmt, tuple(shape or ())),
    )


def _read_sample_rate(r: Reader, m: Mapping, p: str, fmt: str, shape: list) -> Optional[int]:
    """input.sample_rate, which pcm16 needs and no other format reads; also pcm16's own shape
    (one axis: mono samples) and its fixed dtype."""
    if fmt != PCM16:
        if "sample_rate" in m and r.ok(f"{p}.format"):
            r.error(m, "sample_rate", p, "applies to format pcm16 only")
        return None
    if shape and len(shape) != 1:
        r.error(m, "shape", p, f"a pcm16 route takes [samples] (mono audio, one axis), not {shape!r}")
    if "dtype" in m and m["dtype"] != PCM16_DTYPE:
        r.error(m, "dtype", p, f"pcm16 is always little-endian {PCM16_DTYPE}, got {m['dtype']!r}")
    if "sample_rate" not in m:
        r.fail(f"{p}.sample_rate", "is required for format pcm16: the audio's rate in Hz, e.g. 16000",
               getattr(m, "start", None))
        return None
    return r.get(m, "sample_rate", p, int, None, minimum=MIN_SAMPLE_RATE,
                 check=lambda rate: f"must be at most {MAX_SAMPLE_RATE} Hz, got {rate}" if rate > MAX_SAMPLE_RATE else None)


def _read_cache(r: Reader, m: Mapping, base: Path) -> CacheConfig:
    p, d = "cache", CacheConfig()
    return CacheConfig(
        enabled=r.get(m, "enabled", p, bool, d.enabled),
        dir=systemd_base("CACHE_DIRECTORY", base) / r.get(m, "dir", p, str, str(d.dir)),
        max_mb=r.get(m, "max_mb", p, int, d.max_mb, minimum=1),
        ttl_s=r.get(m, "ttl_s", p, (int, float), d.ttl_s, minimum=0),
        memory_mb=r.get(m, "memory_mb", p, int, d.memory_mb, minimum=0),
    )


def _read_metrics(r: Reader, m: Mapping) -> MetricsConfig:
    port = r.get(m, "port", "metrics", (int, type(None)), None)
    if port is not None and not 0 < port < PORT_LIMIT:
        r.error(m, "port", "metrics", f"must be a port in 1..{PORT_LIMIT - 1}, got {port}")
        port = None
    return MetricsConfig(port=port, address=r.get(m, "address", "metrics", str, MetricsConfig.address))


def _read_workers(r: Reader, m: Mapping) -> WorkersConfig:
    p, d = "workers", WorkersConfig()
    if "queue" in m:
        r.error(m, "queue", p, "replaced by workers.queue_mb: queued requests are bounded by their bytes, "
                "and a request's wait by its own deadline")
    most = r.get(m, "max", p, int, d.max, minimum=1)
    return WorkersConfig(
        max=most,
        min=_read_min_workers(r, m, p, most if r.ok(f"{p}.max") else None),
        scale_up_wait_ms=r.get(m, "scale_up_wait_ms", p, (int, float), d.scale_up_wait_ms, minimum=0),
        scale_down_after_s=r.get(m, "scale_down_after_s", p, (int, float), d.scale_down_after_s, minimum=0),
        queue_mb=r.get(m, "queue_mb", p, (int, float), d.queue_mb, minimum=MIN_QUEUE_MB),
        max_wait_ms=optional_float(r.get(m, "max_wait_ms", p, (int, float, type(None)), d.max_wait_ms,
                                         check=_not_negative)),
        drain_timeout_s=r.get(m, "drain_timeout_s", p, (int, float), d.drain_timeout_s, minimum=0),
        processes=r.get(m, "processes", p, int, d.processes, minimum=1),
        idle_unload_s=r.get(m, "idle_unload_s", p, (int, float), d.idle_unload_s, minimum=0),
    )


def _not_negative(value: Optional[float]) -> Optional[str]:
    """For an optional number (null: off), where `minimum` cannot compare a null."""
    return f"must be >= 0 or null, got {value!r}" if value is not None and value < 0 else None


def _read_min_workers(r: Reader, m: Mapping, p: str, most: Optional[int]) -> int:
    """`workers.min`, at most `most`, workers.max when that was read well (its default, the CPU
    count, is named as such)."""
    least = r.get(m, "min", p, int, WorkersConfig.min, minimum=1)
    if most is not None and least > most:
        limit = f"workers.max ({most})" if "max" in m else f"workers.max (default: the CPU count, {most})"
        r.error(m, "min", p, f"must be at most {limit}, got {least}")
        return most
    return least


def _read_batching(r: Reader, m: Mapping) -> BatchingConfig:
    p, d = "batching", BatchingConfig()
    return BatchingConfig(
        max_batch=r.get(m, "max_batch", p, int, d.max_batch, minimum=1),
        max_delay_ms=r.get(m, "max_delay_ms", p, (int, float), d.max_delay_ms, minimum=0),
    )
