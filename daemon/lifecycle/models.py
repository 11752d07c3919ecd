"""The service's models: each verified and loaded once at start-up, then one copy per worker.

The reference copy is loaded to check the file and read its digest, then dropped; each
worker's copy is pinned to that digest and warmed up (run once) when the workers start,
so a model that cannot run still fails start-up, and a file swapped meanwhile is refused.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Mapping, Optional

from daemon.config.model_files import open_model
from daemon.config.schema import Config
from daemon.model.residency import ModelInfo, Residency
from daemon.model.runtime import Model, file_sha256

logger = logging.getLogger(__name__)


def load_models(config: Config, pins: Mapping[str, str], names: Optional[frozenset] = None,
                loaded: Optional[Mapping[str, ModelInfo]] = None) -> dict[str, ModelInfo]:
    """Every model of `config` (or only those in `names`, the others kept from `loaded`), each
    pinned to its digest in `pins` when it has one (a reload's check read them)."""
    models = dict(loaded or {})
    for name, mc in config.models.items():
        if names is not None and name not in names:
            continue
        model = open_model(config, name, max_batch=1, sha256=pins.get(name))
        models[name] = ModelInfo(model.sha256, file_sha256(mc.labels) if mc.labels else "", model.interface)  # the interpreter goes: workers have theirs
        logger.info("model %s: %s (%s, sha256 %s, input %s, %d output(s), %d thread(s))", name, mc.path,
                    model.backend, model.sha256[:12], list(model.input.shape), len(model.outputs), mc.threads)
        if not model.batchable and config.batching.max_batch > 1:
            logger.info("model %s: its batch dimension cannot change (batch %d): its requests run one per "
                        "invoke, batching.max_batch aside", name, model.input.shape[0])
    return models


def worker_models(config: Config, models: Mapping[str, ModelInfo], residency: Residency) -> dict:
    """One worker's own copies, each loaded again on its next request after an idle unload."""
    copies = {}
    for name, reference in models.items():
        load = partial(_warm_model, config, name, reference.sha256)
        copies[name] = residency.copy(name, load(), load)
    return copies


def _warm_model(config: Config, name: str, sha256: str) -> Model:
    """One worker's copy of a model, pinned to the digest loaded at start, its arenas grown."""
    model = open_model(config, name, sha256=sha256)
    model.warm_up()
    return model
