"""The `escalate` route key: a confidence cascade's settings, read and checked.

The frozen section and its pass-1 reader (`read_escalate`); its pass-2 rules (the heavier
model takes the same input and has as many labels) are in check.py. The behaviour lives
in daemon/serve/cascade.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, TypeVar

from daemon import topics
from daemon.config.escalate_v2 import V2TierConfig, read_v2_tier
from daemon.config.reader import Reader, optional_float, read_steps

Route = TypeVar("Route")  # schema.RouteConfig, which imports this module

DEFAULT_TIMEOUT_MS = 500.0
DEFAULT_MAX_RATE_PER_S = 20.0
_WHEN_KEYS = ("score_below", "margin_below")


@dataclass(frozen=True)
class EscalateConfig:
    score_below: Optional[float] = field(default=None, metadata={"yaml": "when.score_below"})
    """Escalate a result whose top-1 score is below this (0..1)."""
    margin_below: Optional[float] = field(default=None, metadata={"yaml": "when.margin_below"})
    """Or: escalate when top-1 minus top-2 score is below this (needs `output.top_k` >= 2).
    Exactly one of the two `when` keys."""
    to_model: Optional[str] = None
    """A heavier model on this node (a key of `models`, same labels): the reply says
    `"tier": "local-large"` when it answered, `"local"` otherwise."""
    preprocess: Optional[tuple] = field(default=None, metadata={"doc_default": "the route's `preprocess`",
                                                                 "doc_type": "list of steps"})
    """`to_model` and `to_v2`: the heavier model's own preprocessing of the route's decoded input
    (the same steps as a route's `preprocess`), for a model that takes another shape: the bundled
    `appliance_large` reads the full-resolution trace. A far model that takes `[N, features]` only,
    as scikit-learn on MLServer does, needs the rows flat: end the steps with a `reshape` to one
    dimension (a route's own steps often end in its TFLite layout, such as `[292, 1]`;
    docs/http.md, A scikit-learn model on MLServer)."""
    to_topic: Optional[str] = None
    """Or: a heavier tier elsewhere (MQTT v5 request/response), a template like `publish`. Or
    `to_v2` (its own section below). Exactly one of `to_model`, `to_topic` and `to_v2`."""
    to_v2: Optional[V2TierConfig] = None
    """Or: a model on an Open Inference Protocol (KServe v2) server: Triton, KServe, MLServer
    (`escalate.to_v2` below, docs/http.md). Exactly one of `to_model`, `to_topic` and `to_v2`."""
    timeout_ms: float = DEFAULT_TIMEOUT_MS
    """`to_topic`, `to_v2`: this long after the request arrived (its queueing and local inference
    count) the local answer is sent, with `"escalation": "timeout"`."""
    max_rate_per_s: float = DEFAULT_MAX_RATE_PER_S
    """Escalations per second at most (token bucket, burst of one second's worth); beyond it the
    local answer is sent (`to_topic`, `to_v2`: with `"escalation": "rate_limited"`). The default
    quietly turns a burst into local answers: of 50 unsure requests arriving together, 20 are
    escalated and 30 answered `rate_limited`, with no error. The stats count them
    (`counts.escalation_rate_limited`) and the log says so once per route every 10 s. Set it to
    what the far tier can take."""

    @property
    def far_timeout_s(self) -> float:
        """How long a far tier has, from the request's arrival: `to_v2.timeout_ms`, else `timeout_ms`."""
        own = self.to_v2.timeout_ms if self.to_v2 is not None else None
        return (self.timeout_ms if own is None else own) / 1000.0

    def large_route(self, route: Route) -> Route:
        """The route as the `to_model` tier runs it: its model and preprocessing, no escalation."""
        return dataclasses.replace(self.far_route(route), model=self.to_model)

    def far_route(self, route: Route) -> Route:
        """The route with the heavier tier's preprocessing and no escalation (`to_v2` decodes and
        preprocesses with it the rows it sends; the route's model keeps naming the labels)."""
        steps = route.preprocess if self.preprocess is None else self.preprocess
        return dataclasses.replace(route, preprocess=steps, escalate=None)

    def wants(self, top_scores: list[float]) -> bool:
        """Whether a result with these descending top-k scores should go to the heavier tier."""
        if self.score_below is not None:
            return top_scores[0] < self.score_below
        second = top_scores[1] if len(top_scores) > 1 else 0.0
        return top_scores[0] - second < (self.margin_below or 0.0)


def read_escalate(r: Reader, m: Mapping, p: str, captures: Optional[int], base: Path,
                  sample_rate: Optional[int] = None) -> Optional[EscalateConfig]:
    """routes[i].escalate (None when absent); `captures` counts the route filter's '+' levels;
    `base`: where `to_v2`'s files are relative to; `sample_rate`: the route's input.sample_rate."""
    if "escalate" not in m or m["escalate"] is None:
        return None
    p = f"{p}.escalate"
    e = r.section(m, "escalate", ("when", "to_model", "preprocess", "to_topic", "to_v2", "timeout_ms",
                                  "max_rate_per_s"), path=p)
    when = r.section(e, "when", _WHEN_KEYS, path=f"{p}.when", required=True)
    given = [k for k in _WHEN_KEYS if k in when]
    if r.ok(f"{p}.when") and len(given) != 1:
        r.fail(f"{p}.when", "needs exactly one of score_below, margin_below", getattr(when, "start", None))
    thresholds = {k: r.get(when, k, f"{p}.when", (int, float), None, minimum=0) for k in _WHEN_KEYS}
    to_model = r.get(e, "to_model", p, str, None)
    to_topic = r.get(e, "to_topic", p, str, None)
    to_v2 = read_v2_tier(r, e, p, base)
    tiers = [t for t in (to_model, to_topic, to_v2) if t is not None]
    if e and len(tiers) != 1 and r.ok(f"{p}.to_model", f"{p}.to_topic", f"{p}.to_v2"):
        r.fail(p, "needs exactly one of to_model, to_topic, to_v2", getattr(e, "start", None))
    steps = read_steps(r, e, p, sample_rate) if "preprocess" in e else None
    if steps is not None and to_topic is not None and r.ok(f"{p}.preprocess"):
        r.error(e, "preprocess", p, "applies to to_model and to_v2 (a to_topic tier preprocesses for itself)")
    if to_topic is not None and (err := topics.template_error(to_topic, captures)):
        r.error(e, "to_topic", p, err.replace("publish template", "to_topic"))
    return EscalateConfig(
        score_below=optional_float(thresholds["score_below"]),
        margin_below=optional_float(thresholds["margin_below"]),
        to_model=to_model, preprocess=steps, to_topic=to_topic, to_v2=to_v2,
        timeout_ms=float(r.get(e, "timeout_ms", p, (int, float), DEFAULT_TIMEOUT_MS, minimum=1)),
        max_rate_per_s=float(r.get(e, "max_rate_per_s", p, (int, float), DEFAULT_MAX_RATE_PER_S, minimum=0)),
    )


