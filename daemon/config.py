"""Typed, frozen config: one dataclass per YAML section, validated in two passes.

Pass 1 (shape) reads each section: unknown keys, wrong types, out-of-range values.
Pass 2 (cross-field) checks what needs several sections or the disk: routes naming
unknown models, duplicate names and filters, templates against filters, model and
label files, and each route's input shape through its preprocessing against the model.
Every problem is collected and raised at once as `ConfigError` with lines of the form
`key.path: message (line N)`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Mapping, Optional

from daemon import topics
from daemon.config_cascade import EscalateConfig, read_escalate
from daemon.config_check import cross_check, open_model, read_labels  # noqa: F401 - re-exported
from daemon.config_mqtt import PORT_LIMIT, MqttConfig, TlsConfig, parse_broker, read_mqtt  # noqa: F401 - re-exported
from daemon.config_reader import Reader, field_names, load_yaml, read_steps, systemd_base
from daemon.config_reuse import ReuseConfig, read_reuse  # noqa: F401 - ReuseConfig re-exported
from daemon.errors import ConfigError
from daemon.rate import COALESCE_CHOICES
from daemon.runtime import RUNTIME_CHOICES

_MIB = 1 << 20
DEFAULT_MAX_BYTES = _MIB  # 1 MiB: payloads above it are answered `too_large` undecoded
INPUT_FORMATS = ("json", "raw", "npy", "image")
INPUT_DTYPES = ("float32", "float64", "int8", "uint8", "int16", "uint16", "int32")
MIN_QUEUE_MB = 0.01  # ~10 KB: room for a single small request (tests shed with it)
MIN_STATS_INTERVAL_S = 0.1
DEFAULT_TOP_K = 3
# Field metadata read by scripts/gen_config_doc.py (docs/config.md): "yaml" is the key when it
# differs from the field's name, "doc_default" a default that is not a literal, "doc": False
# hides a field that is not a YAML key.
_HIDDEN = {"doc": False}


@dataclass(frozen=True)
class ModelConfig:
    name: str = field(metadata=_HIDDEN)  # the key under `models`
    path: Path
    """The full-integer INT8 .tflite file."""
    labels: Path
    """One label per line, in output order."""
    sha256: Optional[str] = None
    """When set, a file with another digest is refused before loading."""


@dataclass(frozen=True)
class InputConfig:
    format: str = "json"
    """json, raw, npy or image (see Input formats)."""
    shape: tuple[int, ...] = field(default=(), metadata={"doc_default": "required"})
    """Shape of one request, in sensor units, before preprocessing."""
    dtype: str = "float32"
    """Element type of raw payloads (json values are parsed as floats)."""
    max_bytes: int = DEFAULT_MAX_BYTES
    """Larger payloads are answered `too_large` before any decoding."""


@dataclass(frozen=True)
class RouteConfig:
    name: str
    """Unique route name, echoed in every reply."""
    subscribe: str
    """Topic filter; each '+' level is a capture for {1}, {2}, ... in `publish`."""
    model: str
    """A key of `models`."""
    input: InputConfig
    """How request payloads are decoded (`routes[].input` below)."""
    preprocess: tuple = field(metadata={"doc_default": "`[]`", "doc_type": "list of steps"})
    """Steps from `daemon.preprocess`, applied in order (see Preprocess steps below)."""
    top_k: int = field(metadata={"yaml": "output.top_k", "doc_default": DEFAULT_TOP_K})
    """How many (label, score) pairs a result lists."""
    publish: str
    """Reply topic template: {1}, {2}, ... are the filter's '+' captures, {topic} the request topic."""
    validate_data: Optional[Path] = field(default=None, metadata={"yaml": "validate.data"})
    """Labelled .npz (x, y) for the gate a changed model must pass on reload (`check-config --deep`)."""
    min_accuracy: float = field(default=0.0, metadata={"yaml": "validate.min_accuracy"})
    """The gate: top-1 accuracy on `validate.data` at least this."""
    min_interval_ms: float = 0.0
    """Per device (= request topic): a request sooner than this after the device's last admitted
    one is answered `rate_limited` at once, without inference. 0: no limit."""
    coalesce: Optional[str] = None
    """`latest`: of a device's queued requests only the newest is served; each older one is
    answered `superseded`. null: every request is served."""
    reuse: Optional[ReuseConfig] = None
    """Per-device fast path (`routes[].reuse` below): off when absent."""
    escalate: Optional[EscalateConfig] = None
    """Confidence cascade: low-confidence results go to a heavier tier (`routes[].escalate` below)."""


@dataclass(frozen=True)
class CacheConfig:
    enabled: bool = True
    """false serves every request from the model."""
    dir: Path = Path(".cache/edge-inferd")
    """Created with mode 0700; survives restarts. Relative: under $CACHE_DIRECTORY when systemd
    sets it (CacheDirectory=), else next to the config file."""
    max_mb: int = 256
    """Size cap in MiB."""
    ttl_s: float = 3600.0
    """Entries expire after this many seconds (both tiers); 0 keeps them until evicted."""
    memory_mb: int = 32
    """In-memory LRU in front of the disk, in MiB; 0 turns the memory tier off."""


@dataclass(frozen=True)
class WorkersConfig:
    max: int = field(default=os.cpu_count() or 1, metadata={"doc_default": "the number of CPUs"})
    """Worker threads at most; each owns one interpreter per model and batch bucket."""
    min: int = 1
    """Worker threads at least. Between `min` and `max` the pool grows and shrinks with the
    load (docs/scaling.md); `min` equal to `max` is a fixed pool."""
    scale_up_wait_ms: float = 50.0
    """A thread is added as soon as a request waits longer than this in the queue (arrival
    to a worker taking it), one per such wait, up to `max`."""
    scale_down_after_s: float = 30.0
    """A thread is retired (after its current batch) once the queue wait stayed below half of
    `scale_up_wait_ms` with a worker idle for this long; at most one per this many seconds."""
    queue_mb: float = 64.0
    """Memory budget of queued requests (payload bytes plus a fixed overhead each). A burst
    that fits is served however many messages it holds; past it requests are `overloaded`."""
    max_wait_ms: float = 2000.0
    """A request whose predicted wait (work queued ahead x measured cost / workers) exceeds
    this is answered `overloaded` at once, instead of being served late."""
    drain_timeout_s: float = 10.0
    """On shutdown, how long queued and in-flight work may take."""
    processes: int = 1
    """Worker processes, each a full daemon with its own MQTT connection (client id
    `<client_id>-w<i>`) in the share group `mqtt.share_group` (default: the client id), so
    they split the node's requests and use more than one core. A supervisor keeps the node's
    status and summed stats and restarts a crashed or stuck process (docs/scaling.md).
    1: one process, no supervisor."""
    idle_unload_s: float = 0.0
    """A model that has run no inference for this long is unloaded from every worker (its
    interpreters freed, the memory given back); the next request for it loads it again on
    its worker. 0: never unload."""

    @property
    def queue_bytes(self) -> int:
        return int(self.queue_mb * _MIB)


@dataclass(frozen=True)
class BatchingConfig:
    max_batch: int = 32
    """A worker takes up to this many queued requests at once and runs one invoke per model."""
    max_delay_ms: float = 0.0
    """How long a worker may wait for more requests to fill a batch (0: take what is queued,
    never wait). The wait never passes the earliest deadline in the batch."""


@dataclass(frozen=True)
class MetricsConfig:
    port: Optional[int] = None
    """Serve Prometheus metrics on this port (null: no endpoint)."""
    address: str = "127.0.0.1"
    """Address to bind; 0.0.0.0 exposes the endpoint to the network."""


@dataclass(frozen=True)
class Config:
    mqtt: MqttConfig
    runtime: str = field(metadata={"doc_default": "`auto`"})
    """TFLite backend: auto (ai-edge-litert, else tflite-runtime), litert or tflite."""
    models: Mapping[str, ModelConfig]
    routes: tuple[RouteConfig, ...]
    cache: CacheConfig
    workers: WorkersConfig
    batching: BatchingConfig = BatchingConfig()
    xnnpack: bool = True
    """litert only: false runs TFLite's built-in kernels, bit-identical to tflite-runtime."""
    stats_interval_s: float = 10.0
    """How often the retained stats go to `edge-inferd/<client_id>/stats` (also at start)."""
    metrics: MetricsConfig = MetricsConfig()
    source: Optional[Path] = field(default=None, metadata=_HIDDEN)
    """The file this config came from, for messages."""

    def with_broker(self, broker: str) -> "Config":
        """A copy with `mqtt.broker` replaced (the `--broker` flag); validated like the file."""
        try:
            return replace(self, mqtt=self.mqtt.with_broker(broker))
        except ValueError as exc:
            raise ConfigError([f"--broker: {exc}"]) from None


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
                                         "batching", "stats_interval_s", "metrics"), required=True)
    if not isinstance(r.raw, dict):  # an empty file, or a list: nothing else to read
        raise ConfigError(r.errors)
    runtime = r.get(root, "runtime", "", str, "auto", choices=RUNTIME_CHOICES)
    return Config(
        mqtt=read_mqtt(r, r.section(root, "mqtt", MqttConfig), base),
        runtime=runtime,
        models=MappingProxyType(_read_models(r, root, base)),
        routes=_read_routes(r, root, base),
        cache=_read_cache(r, r.section(root, "cache", CacheConfig), base),
        workers=_read_workers(r, r.section(root, "workers", (*field_names(WorkersConfig), "queue"))),
        batching=_read_batching(r, r.section(root, "batching", BatchingConfig)),
        xnnpack=r.get(root, "xnnpack", "", bool, True),
        stats_interval_s=r.get(root, "stats_interval_s", "", (int, float), 10.0, minimum=MIN_STATS_INTERVAL_S),
        metrics=_read_metrics(r, r.section(root, "metrics", MetricsConfig)),
        source=path,
    )


def _read_models(r: Reader, root: Mapping, base: Path) -> dict[str, ModelConfig]:
    models = r.get(root, "models", "", dict, None, required=True) or {}
    out = {}
    for name, m in models.items():
        p = f"models.{name}"
        m = r.section(models, name, ("path", "labels", "sha256"), path=p, required=True)
        model_path = r.get(m, "path", p, str, "", required=True)
        labels = r.get(m, "labels", p, str, "", required=True)
        digest = r.get(m, "sha256", p, (str, type(None)), None)
        if digest is not None and (len(digest) != 64 or any(c not in "0123456789abcdefABCDEF" for c in digest)):
            r.error(m, "sha256", p, "must be 64 hex digits")
        out[str(name)] = ModelConfig(str(name), base / model_path, base / labels, digest)
    return out


def _read_routes(r: Reader, root: Mapping, base: Path) -> tuple[RouteConfig, ...]:
    routes = r.get(root, "routes", "", list, None, required=True) or []
    if not routes and "routes" in root:
        r.error(root, "routes", "", "must list at least one route")
    return tuple(route for i, item in enumerate(routes) if (route := _read_route(r, routes, i, base)) is not None)


def _read_route(r: Reader, routes: list, i: int, base: Path) -> Optional[RouteConfig]:
    p = f"routes[{i}]"
    m = r.section(routes, i, ("name", "subscribe", "model", "input", "preprocess", "output", "publish", "validate",
                              "min_interval_ms", "coalesce", "reuse",
                              "escalate"),
                  path=p, required=True)
    subscribe = r.get(m, "subscribe", p, str, "", required=True)
    if subscribe and (err := topics.filter_error(subscribe)):
        r.error(m, "subscribe", p, err)
    publish = r.get(m, "publish", p, str, "", required=True)
    # Placeholders count the filter's '+' levels: a broken filter has none to count.
    captures = topics.wildcard_count(subscribe) if r.ok(f"{p}.subscribe") else None
    if publish and (err := topics.template_error(publish, captures)):
        r.error(m, "publish", p, err)
    output = r.section(m, "output", ("top_k",), path=f"{p}.output")
    gate = r.section(m, "validate", ("data", "min_accuracy"), path=f"{p}.validate")
    data = r.get(gate, "data", f"{p}.validate", str, None, required=bool(gate))
    if data is not None and not (base / data).is_file():
        r.error(gate, "data", f"{p}.validate", f"{base / data}: file not found")
    return RouteConfig(
        name=r.get(m, "name", p, str, "", required=True),
        subscribe=subscribe,
        model=r.get(m, "model", p, str, "", required=True),
        input=_read_input(r, r.section(m, "input", InputConfig, path=f"{p}.input", required=True), f"{p}.input"),
        preprocess=read_steps(r, m, p),
        top_k=r.get(output, "top_k", f"{p}.output", int, DEFAULT_TOP_K, minimum=1),
        publish=publish,
        validate_data=None if data is None else base / data,
        min_accuracy=r.get(gate, "min_accuracy", f"{p}.validate", float, 0.0, minimum=0),
        min_interval_ms=r.get(m, "min_interval_ms", p, float, 0.0, minimum=0),
        coalesce=r.get(m, "coalesce", p, (str, type(None)), None, choices=(*COALESCE_CHOICES, None)),
        reuse=read_reuse(r, m, p),
        escalate=read_escalate(r, m, p, captures),
    )


def _read_input(r: Reader, m: Mapping, p: str) -> InputConfig:
    shape = r.get(m, "shape", p, list, [], required=True)
    if "shape" in m and not (shape and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in shape)):
        r.error(m, "shape", p, f"must be a non-empty list of positive integers, got {shape!r}")
        shape = []
    fmt = r.get(m, "format", p, str, "json", choices=INPUT_FORMATS)
    if fmt == "image" and not _pillow_available():
        r.error(m, "format", p, "'image' needs Pillow: pip install 'edge-inferd[image]'")
    return InputConfig(
        format=fmt,
        shape=tuple(shape or ()),
        dtype=r.get(m, "dtype", p, str, "float32", choices=INPUT_DTYPES),
        max_bytes=r.get(m, "max_bytes", p, int, DEFAULT_MAX_BYTES, minimum=1),
    )


def _pillow_available() -> bool:
    try:
        import PIL.Image  # noqa: F401
    except ImportError:
        return False
    return True


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
                "and overload by workers.max_wait_ms")
    most = r.get(m, "max", p, int, d.max, minimum=1)
    return WorkersConfig(
        max=most,
        min=_read_min_workers(r, m, p, most if r.ok(f"{p}.max") else None),
        scale_up_wait_ms=r.get(m, "scale_up_wait_ms", p, (int, float), d.scale_up_wait_ms, minimum=0),
        scale_down_after_s=r.get(m, "scale_down_after_s", p, (int, float), d.scale_down_after_s, minimum=0),
        queue_mb=r.get(m, "queue_mb", p, (int, float), d.queue_mb, minimum=MIN_QUEUE_MB),
        max_wait_ms=r.get(m, "max_wait_ms", p, (int, float), d.max_wait_ms, minimum=0),
        drain_timeout_s=r.get(m, "drain_timeout_s", p, (int, float), d.drain_timeout_s, minimum=0),
        processes=r.get(m, "processes", p, int, d.processes, minimum=1),
        idle_unload_s=r.get(m, "idle_unload_s", p, (int, float), d.idle_unload_s, minimum=0),
    )


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
