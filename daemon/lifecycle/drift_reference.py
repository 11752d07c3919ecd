"""Each watched route's drift reference from its `validate` data, at start-up and reload.

The validate split runs through the route's whole pipeline on a model pinned to the digest
the service loaded (daemon/pipeline/evaluate.py `answers`), so the reference is the daemon's
own answers to data the operator vouched for. A route without `validate.data`, or whose data
cannot be read, is left without one: daemon/obs/drift.py then takes its first answers.
"""

from __future__ import annotations

import logging
from typing import Mapping, Optional, Sequence

from daemon.config.model_files import open_model
from daemon.config.schema import ANOMALY, Config
from daemon.model.residency import ModelInfo
from daemon.obs.drift import FROM_VALIDATE, DriftMonitor, Reference, RouteSpec
from daemon.pipeline import evaluate, stages
from daemon.pipeline.route_pipeline import RoutePipeline

logger = logging.getLogger(__name__)


def specs(pipes: Sequence[RoutePipeline]) -> list[RouteSpec]:
    """What each route's drift state is made from (a reload keeps the state while it is equal);
    a chain's earlier stages are watched each as an anomaly score (stages.py, STAGE_DRIFT), from
    their first answers."""
    out = []
    for p in pipes:
        out.append(RouteSpec(p.route.name, p.route.kind, p.labels, (p.route, p.model_sha256, p.labels)))
        if p.chain is not None:
            out += [RouteSpec(name, ANOMALY, (), (p.route, p.chain.sha256, name))
                    for name in stages.drift_names(p.route.name, p.route.model, p.chain)]
    return out


def configure(monitor: DriftMonitor, config: Config, pipes: Sequence[RoutePipeline],
              models: Mapping[str, ModelInfo]) -> None:
    """Point the monitor at the routes of `config`, with fresh references for the routes that changed."""
    wanted = specs(pipes)
    fresh = {s.name for s in monitor.stale(config.drift, wanted)}
    references = {}
    for pipe in pipes:
        if pipe.route.name in fresh and pipe.route.validate_data is not None:
            reference = _from_validate(config, pipe, models[pipe.route.model].sha256)
            if reference is not None:
                references[pipe.route.name] = reference
    monitor.configure(config.drift, wanted, references)


def _from_validate(config: Config, pipe: RoutePipeline, sha256: str) -> Optional[Reference]:
    route = pipe.route
    try:
        x, _ = evaluate.load_split(route.validate_data, route)
        model = open_model(config, route.model, sha256=sha256)
        indices, scores = evaluate.answers(pipe, model, x)
    except Exception as exc:  # any failure leaves the route to its first answers; serving goes on
        logger.warning("drift: route %r: no reference from %s (%s); its first %d answers will be the reference",
                       route.name, route.validate_data, exc, config.drift.reference_answers)
        return None
    reference = Reference.of(route.kind, scores, indices, len(pipe.labels), FROM_VALIDATE)
    logger.info("drift: route %r: reference of %d answers from %s", route.name, reference.n, route.validate_data)
    return reference
