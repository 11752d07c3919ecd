"""The gate's child process (daemon/fleet/gate.py): `python -m daemon.fleet.gate_check CONFIG MODEL RELEASE_DIR`.

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

from daemon.config.fleet import release_files
from daemon.config.loader import load_config
from daemon.config.schema import ANOMALY, DETECT, VALUES, Config
from daemon.errors import DaemonError
from daemon.model.runtime import file_sha256
from daemon.pipeline.evaluate import validate


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
        new, _ = validate(candidate, route.name, route.validate_data)
        current, _ = validate(config, route.name, route.validate_data)
        out[route.name] = {"metric": metric, "value": new[metric], "current": current[metric],
                           "data": str(route.validate_data), "data_sha256": file_sha256(route.validate_data)}
    return out


def main(argv: list[str]) -> None:
    config_path, model, release_dir = argv
    config = load_config(Path(config_path), check_models=False)
    print(json.dumps(report(config, model, Path(release_dir))))


if __name__ == "__main__":
    main(sys.argv[1:])
