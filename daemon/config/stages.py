"""The `stages` and `publish_stages` route keys: several models in one route, run in order.

The frozen sections; pass 1 (`read_stages`: each key's type and range); pass 2 without files
(`check_stages`: each stage's model is a key of `models`, and the route's other keys allow
stages); pass 2 with the models loaded (`check_stages_models`: each stage's window, after its
preprocess, is what its model takes). The shape rules (`frames_view`, `window_count`,
`next_frames`) are here so that the check and the running chain (daemon/pipeline/stages.py)
read frames the same way.

The frame rule: a model's output sample (its shape without the batch axis) with its size-1
axes squeezed out; the first axis left counts the frames, the rest is one frame's shape (an
output with nothing left, a single score, is one frame of one value). A windowed stage yields
one frame per window: that window's output, squeezed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Protocol, Sequence

from daemon.config.reader import Reader, read_steps, unknown_model
from daemon.model import preprocess
from daemon.model.interface import TensorSpec

Shape = tuple[int, ...]
STAGE_KINDS = ("classify", "values")  # the answers a chain's last stage may give (schema.CLASSIFY, VALUES)


@dataclass(frozen=True)
class WindowConfig:
    size: int = field(default=1, metadata={"doc_default": "required"})
    """Consecutive frames of the previous stage in one window (at least 1)."""
    hop: int = field(default=1, metadata={"doc_default": "required"})
    """Frames from one window's start to the next one's (at least 1; more than `size` skips frames). Frames
    at the end that do not fill a whole window are dropped."""


@dataclass(frozen=True)
class StageConfig:
    model: str = field(default="", metadata={"doc_default": "required"})
    """A key of `models`: loaded, reloaded and fleet-delivered like any other model."""
    preprocess: tuple = field(default=(), metadata={"doc_default": "`[]`", "doc_type": "list of steps"})
    """Steps applied to each window (or to the whole input of a stage without `window`), the same steps as a
    route's `preprocess`; after them a window must have the model's input shape (check-config says so)."""
    window: Optional[WindowConfig] = None
    """`{size, hop}`: the stage runs on every window of `size` consecutive frames of the previous stage's
    output, every `hop` frames. Absent: the stage takes the previous output whole, once."""


class Shaped(Protocol):
    """What the pass-2 check reads of a loaded model (runtime.Model, check.InterfaceView)."""

    sample_shape: Shape
    outputs: Sequence[TensorSpec]


def squeezed(shape: Shape) -> Shape:
    return tuple(d for d in shape if d != 1)


def frames_view(sample_shape: Shape) -> Shape:
    """(frames, *frame shape) of one output sample: size-1 axes squeezed, the first left counts
    the frames; nothing left (a single value) is one frame of one value."""
    return squeezed(sample_shape) or (1,)


def window_count(frames: int, window: WindowConfig) -> int:
    """Whole windows in `frames` frames (the frames left over at the end are dropped)."""
    return 0 if frames < window.size else (frames - window.size) // window.hop + 1


def stage_input(frames: Shape, stage: StageConfig) -> Shape:
    """The sample a stage's steps get: one window (size, *frame shape), or the frames whole."""
    return frames if stage.window is None else (stage.window.size, *frames[1:])


def next_frames(frames: Shape, stage: StageConfig, out_shape: Shape) -> Shape:
    """The frames a stage yields from `frames`, its model's output sample shape being `out_shape`."""
    if stage.window is None:
        return frames_view(out_shape)
    return (window_count(frames[0], stage.window), *squeezed(out_shape))


def read_stages(r: Reader, m: Mapping, p: str) -> tuple[StageConfig, ...]:
    """Pass 1: routes[i].stages, one StageConfig per item (a bad item keeps its place, so later
    messages name the right index)."""
    items = r.get(m, "stages", p, list, []) or []
    return tuple(_read_stage(r, items, j, f"{p}.stages[{j}]") for j in range(len(items)))


def _read_stage(r: Reader, items: list, j: int, p: str) -> StageConfig:
    s = r.section(items, j, StageConfig, path=p, required=True)
    return StageConfig(model=r.get(s, "model", p, str, "", required=True), preprocess=read_steps(r, s, p),
                       window=_read_window(r, s, p))


def _read_window(r: Reader, s: Mapping, p: str) -> Optional[WindowConfig]:
    if s.get("window") is None:
        return None
    w = r.section(s, "window", WindowConfig, path=f"{p}.window")
    return WindowConfig(size=r.get(w, "size", f"{p}.window", int, 1, required=True, minimum=1),
                        hop=r.get(w, "hop", f"{p}.window", int, 1, required=True, minimum=1))


def check_stages(r: Reader, models: Mapping[str, Any], m: Any, p: str, route: Any) -> None:
    """Pass 2, no files: each stage's model is known; the route's kind and keys allow stages.
    `route`: a schema.RouteConfig (which imports this module)."""
    if not route.stages:
        if route.publish_stages and r.ok(f"{p}.publish_stages"):
            r.error(m, "publish_stages", p, "needs stages: there is no earlier stage to publish")
        return
    raw = m.get("stages") if isinstance(m, dict) else None
    for j, stage in enumerate(route.stages):
        q = f"{p}.stages[{j}]"
        if stage.model and r.ok(f"{q}.model") and models and stage.model not in models:
            r.error(raw[j] if isinstance(raw, list) else {}, "model", q, unknown_model(stage.model, models))
    if route.kind not in STAGE_KINDS and r.ok(f"{p}.output"):
        r.error(m, "stages", p, f"a chain answers output.kind classify or values, not {route.kind}")
    for key, why in (("reuse", "it compares one model's input"), ("escalate", "it reruns one model"),
                     ("validate", "the gate runs one model")):
        if m.get(key) is not None and r.ok(f"{p}.{key}"):
            r.error(m, key, p, f"cannot be used with stages ({why})")


def check_stages_models(r: Reader, m: Any, p: str, route: Any, loaded: Mapping[str, Shaped]) -> None:
    """Pass 2, models loaded: each stage's input (a window, or the previous frames whole) after its
    steps is its model's input shape, and the chain yields at least one window at every stage."""
    first = loaded.get(route.model)
    if not route.stages or first is None or not r.ok(f"{p}.input", f"{p}.preprocess", f"{p}.stages"):
        return
    raw = m.get("stages") if isinstance(m, dict) else None
    previous, model, frames = route.model, first, ()
    for j, stage in enumerate(route.stages):
        q, s = f"{p}.stages[{j}]", raw[j] if isinstance(raw, list) and j < len(raw) else {}
        if len(model.outputs) != 1:
            r.error(s, "model", q, f"takes the output of {previous!r}, which has {len(model.outputs)} outputs "
                    "(a stage before another must have one)")
            return
        frames = next_frames(frames, route.stages[j - 1], model.outputs[0].sample_shape) if j else \
            frames_view(model.outputs[0].sample_shape)
        previous, model = stage.model, loaded.get(stage.model)
        if model is None or not _stage_fits(r, s, q, frames, stage, model):
            return


def _stage_fits(r: Reader, s: Any, q: str, frames: Shape, stage: StageConfig, model: Shaped) -> bool:
    """Whether one stage takes the frames it gets (each problem reported by its key)."""
    w = s.get("window") if isinstance(s, dict) else None
    if stage.window is not None and window_count(frames[0], stage.window) == 0:
        r.error(w, "size", f"{q}.window", f"{stage.window.size} frames, but the previous stage yields "
                f"{frames[0]} (frames {list(frames)}): not one window")
        return False
    given = stage_input(frames, stage)
    try:
        shape = preprocess.output_shape(stage.preprocess, given)
    except ValueError as exc:
        r.error(s, "preprocess", q, f"{exc} (the stage's input is {list(given)})")
        return False
    if shape == tuple(model.sample_shape):
        return True
    if stage.window is not None:
        r.error(w, "size", f"{q}.window", f"a window of {stage.window.size} frames is {list(given)}, "
                f"{list(shape)} after the stage's preprocess, but model {stage.model!r} takes {list(model.sample_shape)}")
    else:
        r.error(s, "model", q, f"the previous stage's frames {list(given)} are {list(shape)} after the stage's "
                f"preprocess, but model {stage.model!r} takes {list(model.sample_shape)}")
    return False
