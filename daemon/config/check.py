"""Pass 2 of config validation: what needs several sections, or the model files on disk.

It runs even when pass 1 found problems, but only on what those problems leave standing: `Reader.ok` says
whether a key path (or anything above or below it) was already reported, so one mistake
yields one message, never a cascade of follow-on errors.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Mapping, Optional

from daemon.config.anchors import find_outputs
from daemon.config.model_files import Labels, open_model, read_labels
from daemon.config.reader import Reader, unknown_model
from daemon.config.then import check_then
from daemon.config.stages import check_stages, check_stages_models
from daemon.config.schema import ANOMALY, CLASSIFY, DETECT, VALUES, Config, ModelConfig, RouteConfig
from daemon.model.interface import Interface, detector_layout, guess_kind
from daemon.errors import DaemonError, ModelError
from daemon.model import preprocess
from daemon.model.crash_probe import crash_loading
from daemon.model.runtime import Model, resolve_backend

logger = logging.getLogger(__name__)


def cross_check(r: Reader, config: Config, check_models: bool) -> None:
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
            r.error(m, "model", p, unknown_model(route.model, config.models))
        check_escalate(r, config, m, p, route)
        check_then(r, config.routes, m, p, route)
        check_stages(r, config.models if models_readable else {}, m, p, route)
    _check_homeassistant(r, config)
    _check_fleet(r, config)
    _check_http(r, config)
    if check_models:
        _check_models(r, config)


def _check_http(r: Reader, config: Config) -> None:
    """One listener per port: worker processes would each try to bind it (the supervisor does not
    share a listening socket yet), and so would the metrics endpoint on the same port."""
    if not config.http.enabled or not r.ok("http.port"):
        return
    raw = _raw_section(r, "http", dict)
    if config.workers.processes > 1 and r.ok("workers.processes"):
        r.error(raw, "port", "http", f"needs workers.processes 1 (got {config.workers.processes}): each worker "
                "process would bind the same port")
    if config.metrics.port == config.http.port and r.ok("metrics.port"):
        r.error(raw, "port", "http", f"{config.http.port} is metrics.port too: give the listener its own port")


def _check_homeassistant(r: Reader, config: Config) -> None:
    """Discovery tracks devices in one process: with several, a share group splits a device's requests
    between them, and one process's idle timer would remove an entity another still feeds."""
    if config.homeassistant.discovery and config.workers.processes > 1 and r.ok("homeassistant", "workers.processes"):
        r.error(_raw_section(r, "homeassistant", dict), "discovery", "homeassistant",
                f"needs workers.processes 1 (got {config.workers.processes}): each process would track "
                "a share of every device's requests")


def _check_fleet(r: Reader, config: Config) -> None:
    """The fleet agent swaps models in one process: a supervisor's worker processes would each run
    an agent of their own over one store."""
    if config.fleet.enabled and config.workers.processes > 1 and r.ok("fleet", "workers.processes"):
        r.error(_raw_section(r, "fleet", dict), "enabled", "fleet",
                f"needs workers.processes 1 (got {config.workers.processes}): each process would install "
                "releases into the same store")
    if config.fleet.enabled and not any(mc.managed for mc in config.models.values()) and r.ok("fleet"):
        r.error(_raw_section(r, "fleet", dict), "enabled", "fleet",
                "no model has managed: true, so nothing would be delivered")


def _raw_section(r: Reader, key: str, kind: type) -> Any:
    value = r.raw.get(key) if isinstance(r.raw, dict) else None
    return value if isinstance(value, kind) else kind()


def _check_models(r: Reader, config: Config) -> None:
    """Load each model once, check its labels, and every route's shapes and kind against it."""
    loaded: dict[str, Model] = {}
    labels: dict[str, Labels] = {}
    models_raw = _raw_section(r, "models", dict)
    for name, mc in config.models.items():
        p, m = f"models.{name}", models_raw.get(name)
        if r.ok(f"{p}.path", f"{p}.sha256"):
            try:
                crash = crash_loading(mc.path, resolve_backend(config.runtime))
                if crash is not None:  # tflite-runtime does not verify a model: a bad one kills the loader
                    raise ModelError(mc.path, crash)
                loaded[name] = open_model(config, name, max_batch=1)
                note = loaded[name].interface.float_note(name)
                if note is not None:  # check-config and the daemon's start-up say it, once
                    logger.info(note)
            except (ModelError, DaemonError) as exc:
                r.error(m, "path", p, str(exc))
        if mc.labels is not None and r.ok(f"{p}.labels"):
            found = _read_labels(r, m, p, mc)
            if found is not None:
                labels[name] = found
    routes_raw = _raw_section(r, "routes", list)
    for i, route in enumerate(config.routes):
        p, m = f"routes[{i}]", routes_raw[i]
        model = loaded.get(route.model)
        if model is not None and r.ok(f"{p}.input.shape", f"{p}.preprocess"):
            _check_route_shape(r, m, p, route, model)
        answers = route if not route.stages else dataclasses.replace(route, model=route.stages[-1].model)
        last = loaded.get(answers.model)  # a chain answers with its last stage's outputs and labels
        if model is not None and last is not None and r.ok(f"{p}.output"):
            _check_kind(r, m, p, answers, last)
            _check_route_labels(r, models_raw.get(answers.model), answers, config.models[answers.model],
                                labels.get(answers.model), last)
        check_escalate_model(r, m, p, route, loaded)
        check_stages_models(r, m, p, route, loaded)


def _read_labels(r: Reader, m: Any, p: str, mc: ModelConfig) -> Optional[Labels]:
    try:
        found = read_labels(mc.labels)
    except (OSError, UnicodeDecodeError) as exc:
        r.error(m, "labels", p, f"{mc.labels}: cannot read the labels file: {getattr(exc, 'strerror', None) or exc}")
        return None
    if found is None:
        r.error(m, "labels", p, f"{mc.labels}: labels file not found")
    return found


def _check_route_labels(r: Reader, m: Any, route: RouteConfig, mc: ModelConfig, labels: Optional[Labels],
                        model: Model) -> None:
    """classify and detect name what they found by the labels; a classifier's must fit its outputs."""
    p = f"models.{mc.name}"
    if route.kind not in (CLASSIFY, DETECT) or not r.ok(f"{p}.labels"):
        return
    if mc.labels is None:
        r.error(m, "labels", p, f"required: route {route.name!r} (output.kind {route.kind}) names what it finds by them")
    elif labels is not None and route.kind == CLASSIFY:
        fits = len(labels.names) <= model.num_outputs if labels.by_id else labels.count == model.num_outputs
        if not fits:
            given = f"ids up to {len(labels.names) - 1}" if labels.by_id else f"{labels.count} labels"
            r.error(m, "labels", p, f"{mc.labels} has {given} but the model has {model.num_outputs} outputs")


def _check_route_shape(r: Reader, m: Any, p: str, route: RouteConfig, model: Model) -> None:
    try:
        shape = preprocess.output_shape(route.preprocess, route.input.shape)
    except ValueError as exc:
        r.error(m, "preprocess", p, str(exc))
        return
    if shape != model.sample_shape:
        r.error(m, "input", p, f"shape {list(route.input.shape)} becomes {list(shape)} after "
                f"preprocessing, but model {route.model!r} takes {list(model.sample_shape)}")


def _check_kind(r: Reader, m: Any, p: str, route: RouteConfig, model: Model) -> None:
    """The route's output kind fits the model's outputs."""
    found = _kind_problem(route, model)
    if found is None:
        return
    key, problem = found
    o = m.get("output") if isinstance(m, dict) else None
    if isinstance(o, dict) and key in o:  # the message points at the key, or at the route's output
        r.error(o, key, f"{p}.output", problem)
    else:
        r.error(m, "output", p, problem)


class InterfaceView:
    """What the route checks read of a model, from its interface alone: a release's manifest
    describes its model's tensors, so a node checks them before a byte of the model is fetched
    (daemon/fleet/node/install.py)."""

    def __init__(self, interface: Interface):
        self.interface = interface
        self.input = interface.inputs[0]
        self.outputs = interface.outputs
        self.num_outputs = sum(spec.sample_size for spec in interface.outputs)
        self.sample_shape = self.input.shape[1:]


def interface_problems(config: Config, model_name: str, interface: Interface) -> list[str]:
    """Why a model with `interface` cannot replace `model_name` on this config's routes (empty:
    it can): the daemon's own refusals, then each route's shape after preprocessing and kind."""
    found = interface.problems()
    if found:
        return found
    view = InterfaceView(interface)
    for route in config.routes:
        if route.model != model_name:
            continue
        shape = preprocess.output_shape(route.preprocess, route.input.shape)
        if shape != view.sample_shape:
            found.append(f"route {route.name!r} feeds {list(shape)} after preprocessing; the release's model takes "
                         f"{list(view.sample_shape)}")
        kind = _kind_problem(route, view)
        if kind is not None:
            found.append(f"route {route.name!r}: {kind[1]}")
    return found


def _kind_problem(route: RouteConfig, model: Model | InterfaceView) -> Optional[tuple[str, str]]:
    """(the output key at fault, why), or None when the kind fits the model."""
    outputs = ", ".join(f"{spec.name} {list(spec.shape)}" for spec in model.outputs)
    if route.kind == CLASSIFY and len(model.outputs) != 1:
        return "kind", (f"kind classify needs a model with one output; {route.model!r} has {len(model.outputs)} "
                        f"({outputs}): {_suggestion(model)}")
    if route.kind == CLASSIFY and route.top_k > model.num_outputs:
        return "top_k", f"top_k {route.top_k} exceeds the model's {model.num_outputs} outputs"
    if route.kind == DETECT and route.anchor_decode is not None:
        try:
            find_outputs(route.anchor_decode, [spec.shape for spec in model.outputs])
        except ValueError as exc:
            return "decode", f"{exc} ({route.model!r})"
        return None
    if route.kind == DETECT and detector_layout(model.outputs) is None:
        return "kind", (f"kind detect needs an SSD model (boxes [1, N, 4], classes, scores, count) or a YOLO "
                        f"model (one [1, 4+C, N] output); {route.model!r} has {outputs}")
    unknown = [n for n in route.outputs if n not in {spec.name for spec in model.outputs}]
    if route.kind == VALUES and unknown:
        return "outputs", f"{', '.join(map(repr, unknown))}: no such output of {route.model!r} (it has {outputs})"
    if route.kind == ANOMALY and model.num_outputs != model.input.sample_size:
        return "kind", (f"kind anomaly needs an autoencoder, whose output has the input's "
                        f"{model.input.sample_size} values; {route.model!r} has {outputs}")
    return None


def _suggestion(model: Model) -> str:
    kind, looks = guess_kind(model.interface)
    return f"it looks like {looks}" + (f" (output.kind: {kind})" if kind else "")


def check_escalate(r: Reader, config: Config, m: Any, p: str, route: RouteConfig) -> None:
    """Pass 2, no files: `to_model` is a known model; a margin needs two scores; `to_v2`'s own
    preprocessing applies to the route's input."""
    esc = route.escalate
    if esc is None:
        return
    e = m.get("escalate") if isinstance(m, dict) else None
    if route.kind != CLASSIFY and r.ok(f"{p}.output"):
        r.error(m, "escalate", p, f"applies to output.kind classify only (it escalates low top-1 scores), "
                f"not {route.kind}")
        return
    if esc.margin_below is not None and route.top_k < 2 and r.ok(f"{p}.output"):
        r.error(e, "when", f"{p}.escalate", "margin_below needs output.top_k of at least 2")
    far = "to_topic" if esc.to_topic is not None else "to_v2" if esc.to_v2 is not None else None
    if far and route.input.stream is not None and r.ok(f"{p}.input"):
        r.error(e, far, f"{p}.escalate", "a far tier takes whole requests, and a stream route's window is made "
                "here from many messages: use to_model on a stream route")
    if esc.to_topic is not None and not config.mqtt.is_v5 and r.ok(f"{p}.escalate.to_topic"):
        r.error(e, "to_topic", f"{p}.escalate", "needs MQTT v5 (mqtt.protocol: 5): request/response properties")
    if esc.to_model is not None and r.ok(f"{p}.escalate.to_model") and esc.to_model not in config.models:
        r.error(e, "to_model", f"{p}.escalate", unknown_model(esc.to_model, config.models))
    if esc.to_v2 is not None and esc.preprocess is not None and r.ok(f"{p}.input.shape", f"{p}.escalate.preprocess"):
        try:  # the rows sent are whatever the steps make: they must at least apply to the input
            preprocess.output_shape(esc.preprocess, route.input.shape)
        except ValueError as exc:
            r.error(e, "preprocess", f"{p}.escalate", str(exc))


def check_escalate_model(r: Reader, m: Any, p: str, route: RouteConfig, loaded: Mapping[str, Model]) -> None:
    """Pass 2, models loaded: `to_model` takes the route's input (after `escalate.preprocess`, else the
    route's) and has the same outputs."""
    esc = route.escalate
    if esc is None or esc.to_model is None or not r.ok(f"{p}.escalate.to_model"):
        return
    e = m.get("escalate") if isinstance(m, dict) else None
    small, large = loaded.get(route.model), loaded.get(esc.to_model)
    own = esc.preprocess is not None
    steps_path = f"{p}.escalate.preprocess" if own else f"{p}.preprocess"
    if small is None or large is None or not r.ok(f"{p}.input.shape", steps_path):
        return
    try:
        shape = preprocess.output_shape(esc.large_route(route).preprocess, route.input.shape)
    except ValueError as exc:
        if own:  # the route's own steps are reported against the route's model already
            r.error(e, "preprocess", f"{p}.escalate", str(exc))
        return
    if shape != large.sample_shape:
        after = "escalate.preprocess" if own else "preprocessing"
        r.error(e, "to_model", f"{p}.escalate", f"model {esc.to_model!r} takes {list(large.sample_shape)}, "
                f"but the route's input becomes {list(shape)} after {after}")
    elif large.num_outputs != small.num_outputs:
        r.error(e, "to_model", f"{p}.escalate", f"model {esc.to_model!r} has {large.num_outputs} outputs, "
                f"{route.model!r} has {small.num_outputs}: the tiers must share the labels")
