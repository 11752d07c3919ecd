"""The `then` route key: a sub-model per detection (detect -> crop -> classify), read and checked.

The frozen section and its pass-1 reader (`read_then`), and its pass-2 rule (`check_then`:
the named route exists and classifies images, so it is no `then` route itself). The behaviour is in
daemon/pipeline/crops.py (the maths) and daemon/pipeline/sub_labels.py (a batch's crops
through the classifier).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from daemon.config.reader import Reader

DEFAULT_PAD = 0.1
DEFAULT_MAX_CROPS = 5
DEFAULT_THEN_MIN_SCORE = 0.0
_CLASSIFY, _DETECT, _IMAGE = "classify", "detect", "image"  # schema.py's words (it imports this module)


@dataclass(frozen=True)
class ThenConfig:
    route: str = field(default="", metadata={"doc_default": "required"})
    """The classify route (another entry of `routes`, taking images) whose model and preprocessing
    classify each box's crop: its `input.shape` and `resize` size the crop, its `preprocess` steps
    apply, and its model's top-1 label and score become the box's `sub_label` and `sub_score`."""
    pad: float = field(default=DEFAULT_PAD, metadata={"yaml": "crop.pad"})
    """Context around each box, as a fraction of the box's own width (left and right) and height
    (top and bottom): 0.1 widens a 100-pixel-wide box by 10 pixels on each side. The padded box is
    clipped to the sent image, then cut from it at the sent image's full resolution."""
    max_crops: int = DEFAULT_MAX_CROPS
    """Boxes classified per reply at most, highest scores first; the others carry
    `"sub_label": null`."""
    min_score: float = DEFAULT_THEN_MIN_SCORE
    """A box scoring below this is not classified (`"sub_label": null`). 0: every box the reply
    lists (each already at least the route's `output.min_score`)."""


def read_then(r: Reader, m: Mapping, p: str) -> Optional[ThenConfig]:
    """routes[i].then (None when absent)."""
    if "then" not in m or m["then"] is None:
        return None
    p = f"{p}.then"
    s = r.section(m, "then", ("route", "crop", "max_crops", "min_score"), path=p)
    crop = r.section(s, "crop", ("pad",), path=f"{p}.crop")
    return ThenConfig(
        route=r.get(s, "route", p, str, "", required=True),
        pad=float(r.get(crop, "pad", f"{p}.crop", (int, float), DEFAULT_PAD, minimum=0)),
        max_crops=r.get(s, "max_crops", p, int, DEFAULT_MAX_CROPS, minimum=1),
        min_score=float(r.get(s, "min_score", p, (int, float), DEFAULT_THEN_MIN_SCORE, minimum=0)),
    )


def then_route(routes: Sequence[Any], then: ThenConfig) -> Optional[Any]:
    """The route `then.route` names (a schema.RouteConfig), None when there is none."""
    return next((route for route in routes if route.name == then.route), None)


def check_then(r: Reader, routes: Sequence[Any], m: Any, p: str, route: Any) -> None:
    """Pass 2, no files: the route detects in images, and `then.route` classifies images (only a
    detect route has a `then`, so a chain of them never loops)."""
    then = route.then
    if then is None:
        return
    t = m.get("then") if isinstance(m, dict) else None
    if route.kind != _DETECT and r.ok(f"{p}.output"):
        r.error(m, "then", p, f"applies to output.kind detect only (it classifies each box), not {route.kind}")
    elif route.input.format != _IMAGE and r.ok(f"{p}.input"):
        r.error(m, "then", p, f"needs input.format image (the crops are cut from the sent picture), "
                f"not {route.input.format}")
    if not then.route or not r.ok(f"{p}.then.route"):
        return
    problem = _target_problem(then_route(routes, then), then)
    if problem:
        r.error(t, "route", f"{p}.then", problem)


def _target_problem(target: Any, then: ThenConfig) -> Optional[str]:
    if target is None:
        return f"no route named {then.route!r}"
    if target.kind != _CLASSIFY:
        return f"route {then.route!r} is output.kind {target.kind}; a sub-model must be classify"
    if target.input.format != _IMAGE:
        return f"route {then.route!r} takes input.format {target.input.format}; a sub-model must take images"
    return None  # a classify route has no `then` (refused at its own key), so no chain can loop
