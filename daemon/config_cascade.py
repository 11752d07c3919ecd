"""The `escalate` route key: a confidence cascade's settings, read and checked.

Split from config.py like config_mqtt.py: the frozen section, its pass-1 reader
(`read_escalate`), and its pass-2 rule (`check_escalate`: the heavier model takes the
same input and has as many labels). The behaviour lives in daemon/cascade.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Optional

from daemon import preprocess, topics
from daemon.config_reader import Reader, read_steps

if TYPE_CHECKING:  # config.py imports this module; the names are for annotations only
    from daemon.config import Config, RouteConfig
    from daemon.runtime import Model

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

    def large_route(self, route: "RouteConfig") -> "RouteConfig":
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
        score_below=_float(thresholds["score_below"]), margin_below=_float(thresholds["margin_below"]),
        to_model=to_model, preprocess=steps, to_topic=to_topic,
        timeout_ms=float(r.get(e, "timeout_ms", p, (int, float), DEFAULT_TIMEOUT_MS, minimum=1)),
        max_rate_per_s=float(r.get(e, "max_rate_per_s", p, (int, float), DEFAULT_MAX_RATE_PER_S, minimum=0)),
    )


def _float(value: Any) -> Optional[float]:
    return None if value is None else float(value)


def check_escalate(r: Reader, config: "Config", m: Any, p: str, route: "RouteConfig") -> None:
    """Pass 2, no files: `to_model` is a known model; a margin needs two scores."""
    esc = route.escalate
    if esc is None:
        return
    e = m.get("escalate") if isinstance(m, dict) else None
    if esc.margin_below is not None and route.top_k < 2 and r.ok(f"{p}.output"):
        r.error(e, "when", f"{p}.escalate", "margin_below needs output.top_k of at least 2")
    if esc.to_topic is not None and not config.mqtt.is_v5 and r.ok(f"{p}.escalate.to_topic"):
        r.error(e, "to_topic", f"{p}.escalate", "needs MQTT v5 (mqtt.protocol: 5): request/response properties")
    if esc.to_model is not None and r.ok(f"{p}.escalate.to_model") and esc.to_model not in config.models:
        known = ", ".join(sorted(config.models)) or "none"
        r.error(e, "to_model", f"{p}.escalate", f"unknown model {esc.to_model!r} (known: {known})")


def check_escalate_model(r: Reader, m: Any, p: str, route: "RouteConfig", loaded: Mapping[str, "Model"]) -> None:
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
