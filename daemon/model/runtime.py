"""The interpreter interface: one small `Model` class over ai-edge-litert or tflite-runtime.

Both backends expose the same `Interpreter` API, so a backend here is just the module
to import it from. `Model` owns exactly one interpreter and is NOT thread-safe: the
worker pool gives each worker its own (see PITFALLS.md, Runtimes).

Quantization is the daemon's job: callers pass float32 in sensor-derived units and get
float32 scores back; the model's own scale and zero-point are applied here.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import time
from collections import deque
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from daemon.errors import DaemonError, ModelError
from daemon.model.dynamic import inspect_sizes, size_input
from daemon.model.interface import Interface, TensorSpec, read_interface
from daemon.model.native_stderr import quiet_native_info

logger = logging.getLogger(__name__)

# Backend name -> module that provides `Interpreter`. Order is the `auto` preference:
# ai-edge-litert is ~10x faster for INT8 on x86 (XNNPACK); tflite-runtime is the
# fallback and the only runtime published for armv7.
BACKENDS = {
    "litert": "ai_edge_litert.interpreter",
    "tflite": "tflite_runtime.interpreter",
}
RUNTIME_CHOICES = ("auto",) + tuple(BACKENDS)

# A TFLite flatbuffer carries this file identifier at bytes 4..8.
_TFLITE_MAGIC = b"TFL3"
_MAGIC_SLICE = slice(4, 8)
_HASH_CHUNK = 1 << 20
_INT8 = np.dtype(np.int8)

InterpreterFactory = Callable[..., Any]


def available_backends() -> list[str]:
    """Backends whose module imports here (tflite-runtime also needs numpy<2 to run)."""
    found = []
    for name, module in BACKENDS.items():
        try:
            importlib.import_module(module)
        except ImportError:
            continue
        found.append(name)
    return found


def resolve_backend(name: str = "auto") -> str:
    """Pick the backend: `auto` means the first available in preference order."""
    if name not in RUNTIME_CHOICES:
        raise DaemonError(f"runtime: unknown backend {name!r}; choose one of {', '.join(RUNTIME_CHOICES)}")
    candidates = list(BACKENDS) if name == "auto" else [name]
    for candidate in candidates:
        try:
            importlib.import_module(BACKENDS[candidate])
        except ImportError:
            continue
        return candidate
    wanted = " or ".join(f"'{BACKENDS[c].split('.')[0]}'" for c in candidates)
    raise DaemonError(f"runtime: no TFLite runtime is installed (need module {wanted}); pip install ai-edge-litert")


def _interpreter_class(backend: str) -> InterpreterFactory:
    return importlib.import_module(BACKENDS[backend]).Interpreter


def _resolver_options(backend: str, xnnpack: bool) -> dict:
    """litert without its default XNNPACK delegate runs TFLite's built-in kernels: bit-identical
    to tflite-runtime 2.14 (which does not run INT8 through XNNPACK), about 4x slower."""
    if xnnpack or backend != "litert":
        return {}
    return _without_default_delegates(backend)


def _without_default_delegates(backend: str) -> dict:
    """Interpreter options for the built-in kernels alone (both runtimes have the option)."""
    resolver = importlib.import_module(BACKENDS[backend]).OpResolverType
    return {"experimental_op_resolver_type": resolver.BUILTIN_WITHOUT_DEFAULT_DELEGATES}


def quantize(x: np.ndarray, scale: float, zero_point: int, dtype: np.dtype = _INT8) -> np.ndarray:
    """Float to integer: round(x / scale) + zero_point, saturated to the dtype's range."""
    info = np.iinfo(dtype)
    q = np.round(np.asarray(x, dtype=np.float64) / scale) + zero_point
    return np.clip(q, info.min, info.max).astype(dtype)


def dequantize(q: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    """Integer to float: (q - zero_point) * scale."""
    return ((np.asarray(q, dtype=np.int32) - zero_point) * scale).astype(np.float32)


def file_sha256(path: Path | str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_HASH_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def to_input(spec: TensorSpec, batch: np.ndarray, as_is: bool = False) -> np.ndarray:
    """(N, *sample shape) -> the input tensor `spec` describes (its batch dimension aside).

    Real values are quantized with the tensor's scale and zero point (or passed as float32 to a
    float-interface model). `as_is`: the values already are the tensor's integers, as a uint8
    image model takes decoded pixels (0..255), so they are only cast."""
    if batch.shape[1:] != spec.shape[1:]:
        raise ValueError(f"input shape {batch.shape[1:]} does not match the model's {spec.shape[1:]}")
    if as_is:
        return np.ascontiguousarray(batch, dtype=spec.dtype)
    return to_model(spec, np.asarray(batch, dtype=np.float32))


def to_model(spec: TensorSpec, x: np.ndarray) -> np.ndarray:
    return quantize(x, spec.scale, spec.zero_point, spec.dtype) if spec.quantized else x.astype(spec.dtype)


def from_model(spec: TensorSpec, q: np.ndarray) -> np.ndarray:
    return dequantize(q, spec.scale, spec.zero_point) if spec.quantized else q.astype(np.float32)


def _read_model(path: Path) -> bytes:
    """The model file's bytes, after the checks that need no interpreter."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ModelError(path, "model file not found") from None
    except OSError as exc:
        raise ModelError(path, f"cannot read model file: {exc.strerror or exc}") from None
    if len(data) < _MAGIC_SLICE.stop or data[_MAGIC_SLICE] != _TFLITE_MAGIC:
        raise ModelError(path, "not a TFLite flatbuffer (missing the 'TFL3' identifier)")
    return data


# Batch sizes an interpreter is kept for: powers of two up to `max_batch`. A batch of
# another size is padded up or split into these, so no interpreter is ever reallocated
# on the request path (resize + allocate_tensors costs far more than an invoke).
_WARM_UP_ROUNDS = 5
_WARM_UP_BUDGET_S = 0.03
# Invokes whose CPU time waits here until taken (daemon/serve/batches.py takes them after each
# batch, for the fleet canary); bounded, so a model nobody takes from (validate, bench) stays small.
_INVOKES_KEPT = 64


def bucket_sizes(max_batch: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to and including `max_batch` (which need not be a power of two)."""
    sizes, size = [], 1
    while size < max_batch:
        sizes.append(size)
        size *= 2
    sizes.append(max_batch)
    return tuple(sizes)


class Model:
    """One loaded model, with one interpreter per batch bucket. Not thread-safe: one per worker."""

    def __init__(
        self,
        path: Path | str,
        *,
        backend: str = "auto",
        num_threads: int = 1,
        expected_sha256: Optional[str] = None,
        xnnpack: bool = True,
        max_batch: int = 1,
        interpreter_factory: Optional[InterpreterFactory] = None,
        sample_shape: Optional[Sequence[int]] = None,
    ):
        """`sample_shape`: what a dynamic input (beyond the batch) is sized to, the route's shape
        after preprocessing (dynamic.py); unused for a model whose input is fixed."""
        self.path = Path(path)
        data = _read_model(self.path)
        self.sha256 = hashlib.sha256(data).hexdigest()
        if expected_sha256 and expected_sha256.lower() != self.sha256:
            raise ModelError(self.path, f"sha256 mismatch: expected {expected_sha256}, file has {self.sha256}")
        self.backend = "fake" if interpreter_factory else resolve_backend(backend)
        self.xnnpack = xnnpack
        factory = interpreter_factory or _interpreter_class(self.backend)
        options = _resolver_options(self.backend, xnnpack)
        self._new_interpreter = lambda: factory(model_content=data, num_threads=num_threads, **options)
        interp, self.interface = self._open(sample_shape)
        self.input = self.interface.inputs[0]
        self.outputs = self.interface.outputs
        self.output = self.outputs[0]  # the first (a classifier's only) output
        # Values per sample over all outputs, flattened and concatenated in output order.
        self.num_outputs = sum(spec.sample_size for spec in self.outputs)
        native = self.input.shape[0]
        self._interps: dict[int, Any] = {native: interp}
        self.buckets = bucket_sizes(max_batch) if self.batchable else (native,)
        # Cost model of one invoke, a * n + b seconds (measured by warm_up): picks padding or splitting.
        self.cost_per_sample_s = 0.0
        self.cost_per_invoke_s = 0.0
        self._invoked: deque[tuple[int, float]] = deque(maxlen=_INVOKES_KEPT)

    def _open(self, sample_shape: Optional[Sequence[int]]) -> tuple[Any, Interface]:
        """The first interpreter and the model's interface; ModelError when it cannot be served."""
        interp, interface = _allocated(self._new_interpreter, self._quiet(), self.path, self.backend, sample_shape)
        problems = interface.problems()
        if problems:
            raise ModelError(self.path, f"cannot serve this model: it {problems[0]}")
        return interp, interface

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """The input shape of one sample (without the batch dimension)."""
        return self.input.shape[1:]

    @property
    def batchable(self) -> bool:
        """True when the model's batch dimension is dynamic, so one invoke can run N samples."""
        return self.interface.batchable

    def quantize(self, batch: np.ndarray, as_is: bool = False) -> np.ndarray:
        """(N, *sample_shape) real values in model units -> the model's input tensor (see `to_input`)."""
        return to_input(self.input, batch, as_is)

    def infer(self, batch: np.ndarray) -> np.ndarray:
        """float32 (N, *sample_shape) -> float32 scores (N, num_outputs)."""
        return self.infer_quantized(self.quantize(batch))

    def infer_quantized(self, q: np.ndarray) -> np.ndarray:
        """Input tensors (N, *sample_shape) -> float32 scores (N, num_outputs), in bucket-sized invokes.

        Each row's scores depend on that row alone (padding rows are zeros and dropped), so a
        sample scores the same in any batch: tests/model/test_runtime.py checks it bit for bit."""
        n = q.shape[0]
        out = np.empty((n, self.num_outputs), dtype=np.float32)
        start = 0
        for size in self.plan(n):
            chunk = q[start : start + size]
            rows = chunk.shape[0]
            if rows < size:
                chunk = np.concatenate([chunk, np.zeros((size - rows,) + chunk.shape[1:], chunk.dtype)])
            out[start : start + rows] = self._invoke(chunk)[:rows]
            start += rows
        return out

    def plan(self, n: int) -> list[int]:
        """Bucket sizes whose invokes cover n samples: full largest buckets, then the remainder
        either padded up to one bucket or split into several, whichever the cost model says is cheaper."""
        largest = self.buckets[-1]
        sizes = [largest] * (n // largest)
        rest = n - len(sizes) * largest
        if rest:
            padded = next(b for b in self.buckets if b >= rest)
            split = self._split(rest)
            pad_cost = self.cost_per_sample_s * padded + self.cost_per_invoke_s
            split_cost = self.cost_per_sample_s * rest + self.cost_per_invoke_s * len(split)
            sizes += [padded] if pad_cost <= split_cost else split
        return sizes

    def _split(self, n: int) -> list[int]:
        parts = []
        for size in reversed(self.buckets):
            while n >= size:
                parts.append(size)
                n -= size
        return parts

    def _quiet(self) -> AbstractContextManager:
        """Only litert's XNNPACK delegate prints the banner: other backends never redirect fd 2."""
        return quiet_native_info() if self.backend == "litert" and self.xnnpack else nullcontext()

    def _interpreter(self, size: int) -> Any:
        interp = self._interps.get(size)
        if interp is None:
            with self._quiet():
                interp = self._new_interpreter()
                interp.resize_tensor_input(self.input.index, [size, *self.sample_shape])
                interp.allocate_tensors()
            self._interps[size] = interp
        return interp

    def take_invokes(self) -> list[tuple[int, float]]:
        """(batch size, CPU seconds) of each invoke since the last call, oldest first: the
        model's own cost, which the fleet canary compares between releases (daemon/fleet/node/canary.py)."""
        taken = list(self._invoked)
        self._invoked.clear()
        return taken

    def _invoke(self, q: np.ndarray) -> np.ndarray:
        interp = self._interpreter(q.shape[0])
        n = q.shape[0]
        self._invoked.append((n, self.cpu_invoke(q, interp)))
        if len(self.outputs) == 1:
            return from_model(self.output, interp.get_tensor(self.output.index)).reshape(n, -1)
        return np.concatenate([from_model(spec, interp.get_tensor(spec.index)).reshape(n, -1)
                               for spec in self.outputs], axis=1)

    def cpu_invoke(self, q: np.ndarray, interp: Any = None) -> float:
        """One invoke of the input tensor `q`; its CPU seconds on this thread, not the wall clock:
        the invoke runs on the calling thread (litert, threads: 1: its process time equals this
        thread's), and the clock stops while another process holds the core."""
        interp = interp or self._interpreter(q.shape[0])
        interp.set_tensor(self.input.index, q)
        started = time.thread_time()
        interp.invoke()
        return time.thread_time() - started

    def warm_up(self) -> None:
        """Build and run every bucket's interpreter once (arenas grow at the first invoke), then
        time the smallest and largest bucket for the pad-or-split cost model."""
        zeros = {size: np.zeros((size, *self.sample_shape), self.input.dtype) for size in self.buckets}
        for size in self.buckets:
            try:
                self._invoke(zeros[size])
            except (ValueError, RuntimeError) as exc:  # a dynamic batch dimension whose graph cannot resize
                if size == self.input.shape[0]:
                    raise
                logger.warning("%s: runs at batch %d only: resizing to %d failed (%s)", self.path.name,
                               self.input.shape[0], size, exc)
                self.buckets = (self.input.shape[0],)
                self._interps = {size: interp for size, interp in self._interps.items() if size in self.buckets}
                zeros = {self.buckets[0]: zeros[self.buckets[0]]}
                break
        small, large = self.buckets[0], self.buckets[-1]
        t_small = self._time(zeros[small])
        t_large = self._time(zeros[large]) if large > small else t_small
        if large > small:
            slope = (t_large - t_small) / (large - small)
            # More samples never cost less: a slope at or below zero is a busy machine slowing the
            # small bucket's timing (seen 1 in 15 warm-ups under load), and the cache and reuse would
            # take the model for free. Per sample at the largest bucket is the honest fallback.
            self.cost_per_sample_s = slope if slope > 0 else t_large / large
        else:
            self.cost_per_sample_s = t_small / small
        self.cost_per_invoke_s = max(0.0, t_small - self.cost_per_sample_s * small)
        self._invoked.clear()  # zeros, timed back to back: not what serving costs

    def _time(self, q: np.ndarray) -> float:
        """The best of a few timed invokes: up to _WARM_UP_ROUNDS, fewer for a model whose invokes
        pass _WARM_UP_BUDGET_S between them (a detector's 20 ms each: a worker added mid-burst
        must not spend a tenth of a second timing itself)."""
        best, spent = float("inf"), 0.0
        for _ in range(_WARM_UP_ROUNDS):
            start = time.perf_counter()
            self._invoke(q)
            took = time.perf_counter() - start
            best, spent = min(best, took), spent + took
            if spent >= _WARM_UP_BUDGET_S:
                break
        return best


def _why(exc: BaseException) -> str:
    """A runtime's refusal in words a user can act on."""
    text = str(exc)
    if "custom op" in text.lower():
        return (f"{text.strip()} (the model needs an op this runtime does not have: an Edge TPU model "
                "(*_edgetpu.tflite) needs its CPU version)")
    return text


def _allocated(new_interpreter: Callable[[], Any], quiet: AbstractContextManager, path: Path,
               backend: str, sample_shape: Optional[Sequence[int]] = None) -> tuple[Any, Interface]:
    """A new interpreter with its tensors allocated, and its interface; ModelError if the runtime
    refuses. A dynamic input is sized to `sample_shape` first (dynamic.py)."""
    try:
        with quiet:  # the XNNPACK delegate's INFO banner (see native_stderr.py)
            interp = new_interpreter()
            size_input(interp, sample_shape, path)
            interp.allocate_tensors()
        return interp, read_interface(interp)
    except (ValueError, RuntimeError) as exc:
        raise ModelError(path, f"{backend} rejected the model: {_why(exc)}") from None


def open_interface(path: Path | str, backend: str = "auto") -> Interface:
    """A model file's interface, whether or not the daemon can serve it (`edge-inferd inspect`).

    Read without the default delegates (XNNPACK, which litert applies to every model and
    tflite-runtime to float ones): the interpreter's nodes are then the file's own operators."""
    path = Path(path)
    data = _read_model(path)
    name = resolve_backend(backend)
    factory = _interpreter_class(name)
    options = _without_default_delegates(name)
    quiet = quiet_native_info if name == "litert" else nullcontext
    new = lambda: factory(model_content=data, **options)  # noqa: E731
    with quiet():
        sizes = inspect_sizes(new())
    for shape in sizes[:-1]:  # a dynamic input: the first size its graph prepares with
        try:
            return _allocated(new, quiet(), path, name, shape)[1]
        except ModelError:
            continue
    return _allocated(new, quiet(), path, name, sizes[-1] if sizes else None)[1]
