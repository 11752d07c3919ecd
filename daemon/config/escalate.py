"""The `escalate` route key: a confidence cascade's settings, read and checked.

The frozen section and its pass-1 reader (`read_escalate`); its pass-2 rules (the heavier
model takes the same input and has as many labels) are in check.py. The behaviour lives
in daemon/serve/cascade.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Mapping, Optional, TypeVar

from daemon import topics
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
    """`to_model`: that model's own preprocessing of the route's decoded input (the same steps as
    a route's `preprocess`), for a heavier model that takes another shape: the bundled
    `appliance_large` reads the full-resolution trace."""
    to_topic: Optional[str] = None
    """Or: a heavier tier elsewhere (MQTT v5 request/response), a template like `publish`.
    Exactly one of `to_model` and `to_topic`."""
    timeout_ms: float = DEFAULT_TIMEOUT_MS
    """`to_topic`: this long after the request arrived (its queueing and local inference count) the
    local answer is sent, with `"escalation": "timeout"`."""
    max_rate_per_s: float = DEFAULT_MAX_RATE_PER_S
    """Escalations per second at most (token bucket, burst of one second's worth); beyond it the
    local answer is sent (`to_topic`: with `"escalation": "rate_limited"`)."""

    def large_route(self, route: Route) -> Route:
        """The route as the `to_model` tier runs it: its model and preprocessing, no escalation."""
        steps = route.preprocess if self.preprocess is None else self.preprocess
        return dataclasses.replace(route, model=self.to_model, preprocess=steps, escalate=None)

    def wants(self, top_scores: list[float]) -> bool:
        """Whether a result with these descending top-k scores should go to the heavier tier."""
        if self.score_below is not None:
            return top_scores[0] < self.score_below
        second = top_scores[1] if len(top_scores) > 1 else 0.0
        return top_scores[0] - second < (self.margin_below or 0.0)


def read_escalate(r: Reader, m: Mapping, p: str, captures: Optional[int]) -> Optional[EscalateConfig]:
    """routes[i].escalate (None when absent); `captures` counts the route filter's '+' levels."""
    if "escalate" not in m or m["escalate"] is None:
        return None
    p = f"{p}.escalate"
    e = r.section(m, "escalate", ("when", "to_model", "preprocess", "to_topic", "timeout_ms", "max_rate_per_s"),
                  path=p)
    when = r.section(e, "when", _WHEN_KEYS, path=f"{p}.when", required=True)
    given = [k for k in _WHEN_KEYS if k in when]
    if r.ok(f"{p}.when") and len(given) != 1:
        r.fail(f"{p}.when", "needs exactly one of score_below, margin_below", getattr(when, "start", None))
    thresholds = {k: r.get(when, k, f"{p}.when", (int, float), None, minimum=0) for k in _WHEN_KEYS}
    to_model = r.get(e, "to_model", p, str, None)
    to_topic = r.get(e, "to_topic", p, str, None)
    if e and (to_model is None) == (to_topic is None) and r.ok(f"{p}.to_model", f"{p}.to_topic"):
        r.fail(p, "needs exactly one of to_model, to_topic", getattr(e, "start", None))
    steps = read_steps(r, e, p) if "preprocess" in e else None
    if steps is not None and to_model is None and r.ok(f"{p}.preprocess"):
        r.error(e, "preprocess", p, "applies only to to_model (a far tier preprocesses for itself)")
    if to_topic is not None and (err := topics.template_error(to_topic, captures)):
        r.error(e, "to_topic", p, err.replace("publish template", "to_topic"))
    return EscalateConfig(
        score_below=optional_float(thresholds["score_below"]),
        margin_below=optional_float(thresholds["margin_below"]),
        to_model=to_model, preprocess=steps, to_topic=to_topic,
        timeout_ms=float(r.get(e, "timeout_ms", p, (int, float), DEFAULT_TIMEOUT_MS, minimum=1)),
        max_rate_per_s=float(r.get(e, "max_rate_per_s", p, (int, float), DEFAULT_MAX_RATE_PER_S, minimum=0)),
    )


