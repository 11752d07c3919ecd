"""Pure, vectorized numpy preprocessing steps built from a route's `preprocess:` list.

Every step works on a batch: `apply` takes an array of shape (N, *sample_shape) and
returns (N, *new_sample_shape). Axes in the config refer to the sample, never to the
batch, so `downsample: {axis: 0}` is the time axis of each sample. `out_shape` gives the
sample shape a step produces (or raises ValueError), which lets config validation
check a route against its model before any data arrives. `canonical` is the JSON-able
form that model cards record (the cache keys on the model's INT8 input instead, which
already reflects every step).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from daemon.model.log_mel import LogMel

Shape = tuple[int, ...]

# ITU-R BT.601 luma weights, the usual RGB -> gray conversion.
_LUMA_WEIGHTS = (0.299, 0.587, 0.114)
# Guards the division in `standardize` for a flat (constant) window.
_DEFAULT_EPS = 1e-6
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))  # Standardize's own arithmetic; others go through numpy's


def _sample_axis(axis: int, ndim: int) -> int:
    """Normalize a (possibly negative) sample axis; raise ValueError when out of range."""
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for a {ndim}-d input")
    return axis % ndim


@dataclass(frozen=True)
class Downsample:
    """Mean of each consecutive group of `factor` samples along `axis`."""

    factor: int
    axis: int = 0

    def out_shape(self, shape: Shape) -> Shape:
        axis = _sample_axis(self.axis, len(shape))
        if self.factor < 1:
            raise ValueError(f"factor must be >= 1, got {self.factor}")
        if shape[axis] % self.factor:
            raise ValueError(f"length {shape[axis]} on axis {axis} is not a multiple of factor {self.factor}")
        return shape[:axis] + (shape[axis] // self.factor,) + shape[axis + 1 :]

    def apply(self, batch: np.ndarray) -> np.ndarray:
        axis = _sample_axis(self.axis, batch.ndim - 1) + 1
        n = batch.shape[axis] // self.factor
        grouped = batch.reshape(batch.shape[:axis] + (n, self.factor) + batch.shape[axis + 1 :])
        return grouped.mean(axis=axis + 1)


@dataclass(frozen=True)
class Normalize:
    """(x - mean) / std, with scalars or per-channel lists (the last axis)."""

    mean: float | tuple[float, ...] = 0.0
    std: float | tuple[float, ...] = 1.0

    def out_shape(self, shape: Shape) -> Shape:
        for name in ("mean", "std"):
            value = getattr(self, name)
            if isinstance(value, tuple) and (not shape or len(value) != shape[-1]):
                channels = shape[-1] if shape else 0
                raise ValueError(f"{name} has {len(value)} values but the input has {channels} channels")
        if np.any(np.asarray(self.std, dtype=np.float64) == 0):
            raise ValueError("std must not be 0")
        return shape

    def apply(self, batch: np.ndarray) -> np.ndarray:
        mean = np.asarray(self.mean, dtype=np.float32)
        std = np.asarray(self.std, dtype=np.float32)
        return (batch - mean) / std


@dataclass(frozen=True)
class Standardize:
    """Per-sample z-score along `axis` (each channel on its own): scale-free input."""

    axis: int = 0
    eps: float = _DEFAULT_EPS

    def out_shape(self, shape: Shape) -> Shape:
        _sample_axis(self.axis, len(shape))
        return shape

    def apply(self, batch: np.ndarray) -> np.ndarray:
        axis = _sample_axis(self.axis, batch.ndim - 1) + 1
        if batch.dtype not in _FLOATS or batch.shape[axis] == 0:  # numpy's own widening and warnings
            mean = batch.mean(axis=axis, keepdims=True)
            std = batch.std(axis=axis, keepdims=True)
            return (batch - mean) / (std + self.eps)
        # np.mean and np.std's own arithmetic (so the same bits), the mean and the centred values
        # made once: 7 against 25 us on one 150-value request (tests/model/test_preprocess.py)
        n = batch.shape[axis]
        mean = np.add.reduce(batch, axis=axis, keepdims=True) / n
        centered = batch - mean
        std = np.sqrt(np.add.reduce(centered * centered, axis=axis, keepdims=True) / n)
        return centered / (std + self.eps)


@dataclass(frozen=True)
class Clip:
    """Limit values to [min, max]: sensor saturation, or a bounded range that INT8 input
    quantization can resolve finely (256 levels over the clipped range, not over rare spikes)."""

    min: float
    max: float

    def out_shape(self, shape: Shape) -> Shape:
        if not self.min < self.max:
            raise ValueError(f"min {self.min} must be below max {self.max}")
        return shape

    def apply(self, batch: np.ndarray) -> np.ndarray:
        return np.clip(batch, self.min, self.max)


@dataclass(frozen=True)
class Window:
    """The last `size` samples along `axis`; zero-padded at the front when shorter."""

    size: int
    axis: int = 0

    def out_shape(self, shape: Shape) -> Shape:
        axis = _sample_axis(self.axis, len(shape))
        if self.size < 1:
            raise ValueError(f"size must be >= 1, got {self.size}")
        return shape[:axis] + (self.size,) + shape[axis + 1 :]

    def apply(self, batch: np.ndarray) -> np.ndarray:
        axis = _sample_axis(self.axis, batch.ndim - 1) + 1
        length = batch.shape[axis]
        if length >= self.size:
            return np.take(batch, np.arange(length - self.size, length), axis=axis)
        pad = [(0, 0)] * batch.ndim
        pad[axis] = (self.size - length, 0)
        return np.pad(batch, pad)


@dataclass(frozen=True)
class Transpose:
    """Permute the sample axes, e.g. channels-first to channels-last."""

    axes: tuple[int, ...]

    def out_shape(self, shape: Shape) -> Shape:
        if sorted(self.axes) != list(range(len(shape))):
            raise ValueError(f"axes {list(self.axes)} are not a permutation of a {len(shape)}-d input")
        return tuple(shape[a] for a in self.axes)

    def apply(self, batch: np.ndarray) -> np.ndarray:
        return np.transpose(batch, (0,) + tuple(a + 1 for a in self.axes))


@dataclass(frozen=True)
class Reshape:
    """Reshape each sample; the element count must stay the same."""

    shape: tuple[int, ...]

    def out_shape(self, shape: Shape) -> Shape:
        if int(np.prod(self.shape)) != int(np.prod(shape)):
            raise ValueError(f"cannot reshape {list(shape)} to {list(self.shape)}")
        return self.shape

    def apply(self, batch: np.ndarray) -> np.ndarray:
        return batch.reshape((batch.shape[0],) + self.shape)


@dataclass(frozen=True)
class Resize:
    """Bilinear resize of an image, (H, W) or (H, W, C), to (height, width)."""

    height: int
    width: int

    def out_shape(self, shape: Shape) -> Shape:
        if len(shape) not in (2, 3):
            raise ValueError(f"resize needs an (H, W) or (H, W, C) input, got {list(shape)}")
        if self.height < 1 or self.width < 1:
            raise ValueError("height and width must be >= 1")
        return (self.height, self.width) + shape[2:]

    def apply(self, batch: np.ndarray) -> np.ndarray:
        rows = _bilinear_axis(batch.shape[1], self.height)
        cols = _bilinear_axis(batch.shape[2], self.width)
        out = _lerp(batch, rows, axis=1)
        return _lerp(out, cols, axis=2)


def _bilinear_axis(src: int, dst: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Source indices (lo, hi) and weights for half-pixel-centre bilinear sampling."""
    pos = (np.arange(dst, dtype=np.float64) + 0.5) * (src / dst) - 0.5
    pos = np.clip(pos, 0, src - 1)
    lo = np.floor(pos).astype(np.intp)
    hi = np.minimum(lo + 1, src - 1)
    return lo, hi, (pos - lo).astype(np.float32)


def _lerp(batch: np.ndarray, index: tuple[np.ndarray, np.ndarray, np.ndarray], axis: int) -> np.ndarray:
    lo, hi, weight = index
    shape = [1] * batch.ndim
    shape[axis] = -1
    weight = weight.reshape(shape)
    return np.take(batch, lo, axis=axis) * (1 - weight) + np.take(batch, hi, axis=axis) * weight


@dataclass(frozen=True)
class Grayscale:
    """(H, W, 3) RGB to (H, W) luma."""

    def out_shape(self, shape: Shape) -> Shape:
        if len(shape) != 3 or shape[2] != 3:
            raise ValueError(f"grayscale needs an (H, W, 3) input, got {list(shape)}")
        return shape[:2]

    def apply(self, batch: np.ndarray) -> np.ndarray:
        return batch @ np.asarray(_LUMA_WEIGHTS, dtype=np.float32)


STEP_TYPES: Mapping[str, type] = {
    "downsample": Downsample,
    "normalize": Normalize,
    "standardize": Standardize,
    "clip": Clip,
    "window": Window,
    "transpose": Transpose,
    "reshape": Reshape,
    "resize": Resize,
    "grayscale": Grayscale,
    "log_mel": LogMel,
}

Step = Any  # any of the dataclasses in STEP_TYPES


def parse_step(item: Any, sample_rate: Optional[int] = None) -> Step:
    """Build one step from `{name: {params}}` (or a bare `name`); ValueError on misuse.

    `sample_rate` is the route's `input.sample_rate` (pcm16), the default of a `log_mel` step's."""
    if isinstance(item, str):
        item = {item: {}}
    if not isinstance(item, Mapping) or len(item) != 1:
        raise ValueError("each step must be a mapping with exactly one key, e.g. {downsample: {factor: 2}}")
    (name, params), = item.items()
    if name not in STEP_TYPES:
        raise ValueError(f"unknown step {name!r}; known: {', '.join(STEP_TYPES)}")
    params = {} if params is None else params
    if not isinstance(params, Mapping):
        raise ValueError(f"{name}: parameters must be a mapping")
    try:
        step = STEP_TYPES[name](**{k: _freeze(v) for k, v in params.items()})
    except TypeError as exc:
        raise ValueError(f"{name}: {exc}") from None
    return step.at_rate(sample_rate) if isinstance(step, LogMel) else step


def _freeze(value: Any) -> Any:
    """Lists become tuples so steps stay hashable and frozen."""
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def output_shape(steps: Sequence[Step], shape: Shape) -> Shape:
    """The sample shape after all steps; ValueError names the failing step."""
    for i, step in enumerate(steps):
        try:
            shape = step.out_shape(shape)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"step {i} ({step_name(step)}): {exc}") from None
    return shape


def apply_steps(steps: Sequence[Step], batch: np.ndarray) -> np.ndarray:
    """Run every step over a (N, *shape) batch; returns float32."""
    out = np.asarray(batch, dtype=np.float32)
    for step in steps:
        out = step.apply(out)
    return np.ascontiguousarray(out, dtype=np.float32)


def step_name(step: Step) -> str:
    return next(name for name, cls in STEP_TYPES.items() if isinstance(step, cls))


def canonical(steps: Sequence[Step]) -> list[dict]:
    """A JSON-able, order-preserving description of the steps (recorded in model cards)."""
    return [{step_name(s): asdict(s)} for s in steps]
