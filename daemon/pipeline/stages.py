"""A route's `stages`: several models in one route, in process, in order (docs/stages.md).

Pure: no threads, MQTT or storage. Stage 0 is the route's own model on the request's input;
each further stage reads the previous stage's output as frames (the rule in
daemon/config/stages.py), runs on every window of them (or on them whole), then its own
preprocess steps and its model. Only the last stage's output is the answer.

`Chain` is the whole chain as one `Runner`, so the request path (request_path.handle_batch)
decodes, quantizes, keys the cache and answers as for one model: the cache key is the route's
own input, stage 0's quantized tensor, with every stage's model and settings in the key's model
part (`ChainPlan.sha256`). Each stage batches on its own: the windows of every request of a
batch go to a stage's model together, in as few invokes as its batch buckets allow.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol, Sequence

import numpy as np

from daemon.config.schema import CLASSIFY, RouteConfig
from daemon.config.stages import Shape, StageConfig, WindowConfig, frames_view, next_frames, window_count
from daemon.model import preprocess
from daemon.pipeline import postprocess
from daemon.pipeline.postprocess import VALUE_DECIMALS, VALUES_DEFAULT_MAX, ModelOutputs

STAGE_TIMING = "stage{index}:{model}"  # the batch's timing of one stage (stats `latency_ms.stages`)
# An earlier stage's drift, watched as an anomaly route's score is (daemon/obs/drift.py): per request,
# the mean of the stage's output frames, under this name in the stats' `drift`.
STAGE_DRIFT = "{route}/stage{index}:{model}"
WINDOWS_COUNTER = "stage_windows.{model}"  # inputs a stage's model ran on: its windows, or one per request


class StageRunner(Protocol):
    """What a stage needs of a model (route_pipeline.Runner, which also satisfies this)."""

    cost_per_sample_s: float

    def quantize(self, batch: np.ndarray, as_is: bool = False) -> np.ndarray: ...
    def infer_quantized(self, q: np.ndarray) -> np.ndarray: ...
    def take_invokes(self) -> list[tuple[int, float]]: ...


@dataclass(frozen=True)
class StagePipe:
    """One stage after the route's own model, with what its model was loaded as."""

    config: StageConfig
    sha256: str
    frames: Shape
    """What the stage yields per request: (frames, *frame shape)."""
    inputs: int
    """Inputs its model runs on per request: its windows, or 1."""


@dataclass(frozen=True)
class ChainPlan:
    """A route's chain, its shapes known at load from the models' tensors."""

    first_frames: Shape
    """Stage 0's (the route's model's) output as frames."""
    stages: tuple[StagePipe, ...]
    sha256: str
    """The cache key's model part: every stage's model digest and settings."""

    @property
    def width(self) -> int:
        """Values of the answer per request: the last stage's output over all its windows."""
        return math.prod(self.stages[-1].frames)


def plan(route: RouteConfig, first_sha256: str, first_output: Shape,
         stage_models: Sequence[tuple[str, Shape]]) -> ChainPlan:
    """The chain of `route`: stage 0's digest and output sample shape, then each stage's."""
    frames = first = frames_view(first_output)
    key = hashlib.sha256(first_sha256.encode())
    stages = []
    for stage, (sha256, out_shape) in zip(route.stages, stage_models):
        frames = next_frames(frames, stage, out_shape)
        inputs = 1 if stage.window is None else frames[0]
        stages.append(StagePipe(stage, sha256, frames, inputs))
        key.update(f"\0{sha256}\0{stage.window}\0{preprocess.canonical(stage.preprocess)}".encode())
    return ChainPlan(first, tuple(stages), key.hexdigest())


def windows(frames: np.ndarray, window: WindowConfig) -> np.ndarray:
    """(N, T, *F) frames -> (N * W, size, *F): every whole window of each request, in order
    (one gather: the windows overlap, so each is a copy the steps may change)."""
    n, t = frames.shape[:2]
    count = window_count(t, window)
    index = np.arange(count)[:, None] * window.hop + np.arange(window.size)
    return frames[:, index].reshape(n * count, window.size, *frames.shape[2:])


def run_stage(stage: StagePipe, runner: StageRunner, frames: np.ndarray) -> np.ndarray:
    """One stage over a batch's frames (N, T, *F) -> the frames it yields (N, *stage.frames)."""
    window = stage.config.window
    x = frames if window is None else windows(frames, window)
    x = preprocess.apply_steps(stage.config.preprocess, x)
    out = runner.infer_quantized(runner.quantize(x))  # every request's windows together: bucketed
    return out.reshape(len(frames), *stage.frames)


class Chain:
    """The chain as one `Runner` for the request path; after `infer_quantized` it holds the
    stages' timings, the inputs each stage ran on, and (publish) each earlier stage's frames."""

    def __init__(self, chain: ChainPlan, route_model: str, first: StageRunner, runners: Sequence[StageRunner],
                 clock: Callable[[], float], publish: bool = False):
        if len(runners) != len(chain.stages):
            raise ValueError(f"the chain has {len(chain.stages)} stages after its model, given {len(runners)} runners")
        self._chain, self._first, self._runners, self._clock = chain, first, tuple(runners), clock
        self._names = (route_model, *(s.config.model for s in chain.stages))
        self._publish = publish
        self.num_outputs = chain.width
        self.cost_per_sample_s = first.cost_per_sample_s + sum(
            r.cost_per_sample_s * s.inputs for s, r in zip(chain.stages, runners))
        self.timings: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.earlier: list[np.ndarray] = []
        self.levels: list[tuple[int, np.ndarray]] = []
        """Per earlier stage (its index), each request's mean output: what its drift watches."""

    def quantize(self, batch: np.ndarray, as_is: bool = False) -> np.ndarray:
        return self._first.quantize(batch, as_is)

    def infer_quantized(self, q: np.ndarray) -> np.ndarray:
        n = q.shape[0]
        mark = self._clock()
        frames = self._first.infer_quantized(q).reshape(n, *self._chain.first_frames)
        mark = self._took(0, mark)
        for k, (stage, runner) in enumerate(zip(self._chain.stages, self._runners), start=1):
            if self._publish:
                self.earlier.append(frames)
            self.levels.append((k - 1, frames.reshape(n, -1).mean(axis=1)))
            frames = run_stage(stage, runner, frames)
            name = WINDOWS_COUNTER.format(model=stage.config.model)
            self.counts[name] = self.counts.get(name, 0) + n * stage.inputs
            mark = self._took(k, mark)
        return frames.reshape(n, -1)

    def take_invokes(self) -> list[tuple[int, float]]:
        return self._first.take_invokes()

    def _took(self, index: int, mark: float) -> float:
        now = self._clock()
        name = STAGE_TIMING.format(index=index, model=self._names[index])
        self.timings[name] = self.timings.get(name, 0.0) + now - mark
        return now


def reply_fields(route: RouteConfig, labels: postprocess.Labelled, outputs: ModelOutputs, row: np.ndarray,
                 chain: ChainPlan) -> dict[str, Any]:
    """The answer's fields from the last stage's output row (all its windows). A windowed last
    stage answers per window: `windows` lists each one; the top-level fields are the window with
    the highest score (classify) or the last window, the newest frames (values), and `window`
    says which."""
    per = row.reshape(-1, outputs.offsets[-1])
    if chain.stages[-1].config.window is None:
        return postprocess.fields(route, labels, outputs, per[0])
    found = [postprocess.fields(route, labels, outputs, one) for one in per]
    if route.kind == CLASSIFY:
        pick = max(range(len(found)), key=lambda i: found[i]["score"])  # the first of equal scores
        brief = [{"label": f["label"], "score": f["score"]} for f in found]
    else:
        pick, brief = len(found) - 1, found
    return {**found[pick], "window": pick, "windows": brief}


def published(chain: ChainPlan, route_model: str, earlier: Sequence[np.ndarray], row: int) -> list[dict]:
    """`publish_stages`: each earlier stage's output for one request, its values left out (the
    shape kept) past VALUES_DEFAULT_MAX, as a `values` reply leaves a large output out."""
    names = (route_model, *(s.config.model for s in chain.stages[:-1]))
    out = []
    for name, frames in zip(names, earlier):
        one = frames[row]
        entry: dict[str, Any] = {"model": name, "frames": int(one.shape[0]), "shape": list(one.shape)}
        if one.size <= VALUES_DEFAULT_MAX:
            entry["values"] = np.round(one, VALUE_DECIMALS).tolist()
        else:
            entry["left_out"] = {"values": list(one.shape)}
        out.append(entry)
    return out


def drift_names(route: str, route_model: str, chain: ChainPlan) -> list[str]:
    """The drift names of a chain's earlier stages (stage 0, the route's model, to the one before
    the last: the last stage's output is the route's own answer, watched under the route's name)."""
    names = (route_model, *(s.config.model for s in chain.stages[:-1]))
    return [STAGE_DRIFT.format(route=route, index=k, model=name) for k, name in enumerate(names)]


def drift_answers(route: str, route_model: str, chain: ChainPlan, levels: Sequence[tuple[int, np.ndarray]]) -> list:
    """The drift monitor's answers (name, None, score) of a batch's earlier stages."""
    names = drift_names(route, route_model, chain)
    return [(names[k], None, float(v)) for k, values in levels for v in values]


def runners_for(chain: Optional[ChainPlan], models: Any) -> list:
    """The worker's runners of a chain's stages, by model name (none for a route without stages)."""
    return [] if chain is None else [models[s.config.model] for s in chain.stages]
