"""Scale to zero: a model that has run no inference for `workers.idle_unload_s` is unloaded
from every worker, and loaded again by the first worker that needs it.

Each worker's copy of a model is a `LazyModel` (a `pipeline.Runner`): quantizing, the output
size and the cost model are kept as plain data, so only an invoke needs the interpreters. An
invoke takes the copy's lock, loads the model if it was unloaded (on that worker's thread,
from `load`, which pins the digest read at start-up) and records the use.

Who unloads: the main loop (`Service._main_loop`) calls `Residency.unload_idle` on its ticks.
A worker cannot do it itself, because an idle worker is blocked waiting for its next batch
and never reaches "between batches". The copy's lock keeps the two apart: the main loop
only try-acquires it, so it never waits on an invoke, and a copy in use is never freed
(interpreters are not thread-safe, but used one thread at a time under a lock they are
safe). Freed interpreters go back to glibc, which keeps the pages; `malloc_trim(0)` returns
them to the system (docs/scaling.md measures the difference).

The idle decision is pure and clock-injected (`IdleClock`), tested with a fake clock.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from daemon.model.interface import Interface, TensorSpec
from daemon.model.runtime import Model, to_input

logger = logging.getLogger(__name__)

Clock = Callable[[], float]
MS = 1000.0


@dataclass(frozen=True)
class ModelInfo:
    """What the daemon keeps of a model once its reference copy is dropped: no interpreter, the
    digests it was loaded with (a reload compares them: daemon/lifecycle/reload.py `fingerprint`)."""

    sha256: str
    labels_sha256: str
    interface: Interface
    """Its tensors, for the routes' post-processing (daemon/pipeline/postprocess.py)."""

    @property
    def fingerprint(self) -> tuple[str, str]:
        return self.sha256, self.labels_sha256


class IdleClock:
    """Which models have run nothing for `idle_s` seconds (0: none ever), by their last use."""

    def __init__(self, idle_s: Callable[[], float], clock: Clock = time.monotonic):
        self._idle_s = idle_s
        self._clock = clock
        self._last: dict[str, float] = {}

    @property
    def idle_s(self) -> float:
        return self._idle_s()

    def used(self, name: str) -> None:
        """The model ran (or was loaded) now. A dict store: safe from any thread under the GIL."""
        self._last[name] = self._clock()

    def idle(self, name: str) -> bool:
        idle_s = self._idle_s()
        last = self._last.get(name)
        return idle_s > 0 and last is not None and self._clock() - last >= idle_s

    def due_in(self, names: set[str]) -> Optional[float]:
        """Seconds until the first of `names` becomes idle (0 if one already is); None: never."""
        idle_s = self._idle_s()
        times = [self._last[name] for name in names if name in self._last]
        if idle_s <= 0 or not times:
            return None
        return max(0.0, min(times) + idle_s - self._clock())


def trim_heap() -> None:
    """Hand freed heap pages back to the system: glibc keeps them for reuse otherwise, so RSS
    would not fall. Not every libc has malloc_trim (musl has not); there it is skipped."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class LazyModel:
    """One worker's copy of one model: loaded at start, freed when idle, loaded again on use."""

    def __init__(self, name: str, model: Model, load: Callable[[], Model], residency: "Residency"):
        self.name = name
        self._model: Optional[Model] = model
        self._load = load
        self._residency = residency
        self._lock = threading.Lock()
        self._input: TensorSpec = model.input
        self.num_outputs = model.num_outputs
        self.cost_per_sample_s = model.cost_per_sample_s

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def quantize(self, batch: np.ndarray, as_is: bool = False) -> np.ndarray:
        """As `Model.quantize`, without the interpreter (a cache hit needs no load)."""
        return to_input(self._input, batch, as_is)

    def infer_quantized(self, q: np.ndarray) -> np.ndarray:
        with self._lock:
            model = self._model or self._reload()
            try:
                return model.infer_quantized(q)
            finally:
                self._residency.clock.used(self.name)

    def take_invokes(self) -> list[tuple[int, float]]:
        """As `Model.take_invokes` (none while unloaded: an unload takes its invokes with it)."""
        with self._lock:
            return [] if self._model is None else self._model.take_invokes()

    def _reload(self) -> Model:
        started = time.perf_counter()
        model = self._load()
        self._model = model
        self.cost_per_sample_s = model.cost_per_sample_s
        self._residency.loaded(self.name, time.perf_counter() - started)
        return model

    def unload_if_idle(self) -> bool:
        """Free the interpreters if the model is idle and this copy is not in use right now."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self._model is None or not self._residency.clock.idle(self.name):
                return False
            self._model = None
            return True
        finally:
            self._lock.release()


class Residency:
    """Every worker's copies of the models (weakly held: a retired worker's go with it), the
    idle clock, and the cold starts by model, for the stats."""

    def __init__(self, idle_s: Callable[[], float], clock: Clock = time.monotonic,
                 give_back: Callable[[], None] = trim_heap):
        self.clock = IdleClock(idle_s, clock)
        self._give_back = give_back
        self._copies: weakref.WeakSet[LazyModel] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._cold: dict[str, tuple[int, float]] = {}  # model -> (loads after an unload, last ms)

    def copy(self, name: str, model: Model, load: Callable[[], Model]) -> LazyModel:
        """Wrap a worker's freshly loaded copy; its idle time starts now."""
        lazy = LazyModel(name, model, load, self)
        with self._lock:
            self._copies.add(lazy)
        self.clock.used(name)
        return lazy

    def _all(self) -> list[LazyModel]:
        with self._lock:
            return list(self._copies)

    def loaded(self, name: str, seconds: float) -> None:
        """A worker loaded `name` again after an unload (its cold start)."""
        count, _ = self._cold.get(name, (0, 0.0))
        self._cold[name] = (count + 1, seconds * MS)
        logger.info("model %s: loaded again on %s in %.1f ms", name, threading.current_thread().name, seconds * MS)

    def unload_idle(self) -> list[str]:
        """Main loop: free the idle models' copies, then give the memory back. Names freed."""
        if self.clock.idle_s <= 0:
            return []
        freed = sorted({lazy.name for lazy in self._all() if lazy.loaded and lazy.unload_if_idle()})
        if freed:
            gc.collect()  # interpreter wrappers may sit in reference cycles
            self._give_back()
            for name in freed:
                logger.info("model %s: idle for %gs, unloaded", name, self.clock.idle_s)
        return freed

    def due_in(self) -> Optional[float]:
        """Seconds until a loaded model may go idle (None: nothing to unload, ever)."""
        return self.clock.due_in({lazy.name for lazy in self._all() if lazy.loaded})

    def state(self) -> dict[str, dict]:
        """By model: `loaded` (any worker holds it), `cold_starts` and the last `cold_start_ms`."""
        out: dict[str, dict] = {}
        for lazy in self._all():
            entry = out.setdefault(lazy.name, {"loaded": False})
            entry["loaded"] = entry["loaded"] or lazy.loaded
        for name, entry in out.items():
            count, last_ms = self._cold.get(name, (0, None))
            entry.update(cold_starts=count, cold_start_ms=last_ms)
        return out
