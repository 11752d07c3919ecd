"""The gate's child process (daemon/fleet/node/gate.py): `python -m daemon.fleet.node.gate_check CONFIG MODEL RELEASE_DIR`.

Prints one JSON object: per route of MODEL with `validate.data`, the metric of its kind
measured with RELEASE_DIR's files (`value`) and with the running ones (`current`), the data
file and its sha256. A model that cannot load or run makes it fail (exit 1, or a signal).
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import numpy as np

from daemon.config.fleet import release_files
from daemon.config.loader import load_config
from daemon.config.model_files import open_model, read_labels
from daemon.config.schema import ANOMALY, CLASSIFY, DETECT, VALUES, Config
from daemon.errors import DaemonError
from daemon.model.runtime import file_sha256
from daemon.pipeline.evaluate import find_route, load_split, predict, validate
from daemon.pipeline.route_pipeline import route_pipeline


def metric_of(kind: str) -> str:
    return {ANOMALY: "roc_auc", VALUES: "mae"}.get(kind, "accuracy")


def with_release(config: Config, model: str, release_dir: Path) -> Config:
    """`config` with `model` served from the release in `release_dir`."""
    files = release_files(release_dir)
    if files is None:
        raise DaemonError(f"{release_dir}: no readable manifest.json")
    mc = config.models[model]
    models = dict(config.models)
    models[model] = replace(mc, path=files.model_path, labels=files.labels_path or mc.labels,
                            sha256=files.model_sha256, release=files.serial)
    return replace(config, models=MappingProxyType(models))


def report(config: Config, model: str, release_dir: Path) -> dict:
    candidate = with_release(config, model, release_dir)
    out = {}
    for route in config.routes:
        if route.model != model or route.validate_data is None or route.kind == DETECT:
            continue
        metric = metric_of(route.kind)
        if route.kind == CLASSIFY and config.models[model].labels and candidate.models[model].labels:
            new, current = (label_accuracy(c, config, route.name, route.validate_data) for c in (candidate, config))
        else:
            new, current = (validate(c, route.name, route.validate_data)[0][metric] for c in (candidate, config))
        out[route.name] = {"metric": metric, "value": new, "current": current,
                           "data": str(route.validate_data), "data_sha256": file_sha256(route.validate_data)}
    return out


def label_accuracy(config: Config, running: Config, route_name: str, data: Path) -> float:
    """Top-1 accuracy by label name: the data's labels are the running release's indices, and a
    release's answers are read through its own labels file, so a release that permutes its labels
    (or its outputs without its labels) scores as badly as it would answer."""
    route = find_route(config, route_name)
    model = open_model(config, route.model)
    x, y = load_split(data, route)
    truth = read_labels(running.models[route.model].labels)
    names = read_labels(config.models[route.model].labels)
    predicted = predict(route_pipeline(config, route, model), model, x)
    hits = [names.name(int(p)) == truth.name(int(t)) for p, t in zip(predicted, y)]
    return round(float(np.mean(hits)), 6) if hits else 0.0


def main(argv: list[str]) -> None:
    config_path, model, release_dir = argv
    config = load_config(Path(config_path), check_models=False)
    print(json.dumps(report(config, model, Path(release_dir))))


if __name__ == "__main__":
    main(sys.argv[1:])
