"""Pass 2 of config validation: what needs several sections, or the model files on disk.

Split from config.py (which re-exports `open_model` and `read_labels`). It runs even when
pass 1 found problems, but only on what those problems leave standing: `Reader.ok` says
whether a key path (or anything above or below it) was already reported, so one mistake
yields one message, never a cascade of follow-on errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from daemon import preprocess
from daemon.config_cascade import check_escalate, check_escalate_model
from daemon.config_reader import Reader
from daemon.errors import DaemonError, ModelError
from daemon.runtime import Model

if TYPE_CHECKING:  # config.py imports this module; the names are for annotations only
    from daemon.config import Config, ModelConfig, RouteConfig


def cross_check(r: Reader, config: "Config", check_models: bool) -> None:
    """Duplicate route names and filters, unknown models; then (check_models) the files."""
    routes_raw = _raw_section(r, "routes", list)
    seen_names: dict[str, int] = {}
    seen_filters: dict[str, int] = {}
    for i, route in enumerate(config.routes):
        p, m = f"routes[{i}]", routes_raw[i]
        if route.name and r.ok(f"{p}.name"):
            if route.name in seen_names:
                r.error(m, "name", p, f"duplicate route name {route.name!r} (also routes[{seen_names[route.name]}])")
            seen_names.setdefault(route.name, i)
        if route.subscribe and r.ok(f"{p}.subscribe"):
            if route.subscribe in seen_filters:
                first = seen_filters[route.subscribe]
                r.error(m, "subscribe", p, f"filter {route.subscribe!r} is already routed by routes[{first}]")
            seen_filters.setdefault(route.subscribe, i)
        models_readable = bool(config.models) or r.ok("models")
        if route.model and r.ok(f"{p}.model") and models_readable and route.model not in config.models:
            known = ", ".join(sorted(config.models)) or "none"
            r.error(m, "model", p, f"unknown model {route.model!r} (known: {known})")
        check_escalate(r, config, m, p, route)
    if check_models:
        _check_models(r, config)


def _raw_section(r: Reader, key: str, kind: type) -> Any:
    value = r.raw.get(key) if isinstance(r.raw, dict) else None
    return value if isinstance(value, kind) else kind()


def _check_models(r: Reader, config: "Config") -> None:
    """Load each model once, check its labels, and every route's shapes against it."""
    loaded: dict[str, Model] = {}
    models_raw = _raw_section(r, "models", dict)
    for name, mc in config.models.items():
        p, m = f"models.{name}", models_raw.get(name)
        path_ok, labels_ok = r.ok(f"{p}.path", f"{p}.sha256"), r.ok(f"{p}.labels")
        if path_ok:
            try:
                loaded[name] = open_model(config, name, max_batch=1)
            except (ModelError, DaemonError) as exc:
                r.error(m, "path", p, str(exc))
        if labels_ok:
            _check_labels(r, m, p, mc, loaded.get(name))
    routes_raw = _raw_section(r, "routes", list)
    for i, route in enumerate(config.routes):
        p = f"routes[{i}]"
        if route.model in loaded and r.ok(f"{p}.input.shape", f"{p}.preprocess"):
            _check_route_shape(r, routes_raw[i], p, route, loaded[route.model])
        check_escalate_model(r, routes_raw[i], p, route, loaded)


def _check_labels(r: Reader, m: Any, p: str, mc: "ModelConfig", model: Optional[Model]) -> None:
    try:
        labels = read_labels(mc.labels)
    except (OSError, UnicodeDecodeError) as exc:
        r.error(m, "labels", p, f"{mc.labels}: cannot read the labels file: {getattr(exc, 'strerror', None) or exc}")
        return
    if labels is None:
        r.error(m, "labels", p, f"{mc.labels}: labels file not found")
    elif model is not None and len(labels) != model.num_outputs:
        r.error(m, "labels", p, f"{mc.labels} has {len(labels)} labels but the model has {model.num_outputs} outputs")


def _check_route_shape(r: Reader, m: Any, p: str, route: "RouteConfig", model: Model) -> None:
    try:
        shape = preprocess.output_shape(route.preprocess, route.input.shape)
    except ValueError as exc:
        r.error(m, "preprocess", p, str(exc))
        return
    if shape != model.sample_shape:
        r.error(m, "input", p, f"shape {list(route.input.shape)} becomes {list(shape)} after "
                f"preprocessing, but model {route.model!r} takes {list(model.sample_shape)}")
    if route.top_k > model.num_outputs and r.ok(f"{p}.output"):
        r.error(m, "output", p, f"top_k {route.top_k} exceeds the model's {model.num_outputs} outputs")


def open_model(config: "Config", name: str, max_batch: Optional[int] = None,
               sha256: Optional[str] = None) -> Model:
    """Load model `name` as the config says: its backend, pinned digest, XNNPACK and batch buckets.

    `max_batch=1` for a copy that only checks or describes the model (no batch interpreters
    to build); `sha256` pins a digest already read (the workers' copies of a loaded model)."""
    mc = config.models[name]
    return Model(mc.path, backend=config.runtime, expected_sha256=sha256 or mc.sha256, xnnpack=config.xnnpack,
                 max_batch=max_batch or config.batching.max_batch)


def read_labels(path: Path) -> Optional[list[str]]:
    """Labels, one per non-empty line; None when the file is missing."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    return [line.strip() for line in text.splitlines() if line.strip()]
