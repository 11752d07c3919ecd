"""The per-device fast path: a device whose input barely changed gets its last result again.

A device is a request topic (`sensors/dev7/imu`). For each device a route remembers the
input of its last *inferred* request and that request's scores. A new request whose
input differs from it by at most `max_change` (max absolute difference) while that
result is younger than `max_age_s` is answered with the remembered scores, without
quantizing or invoking the model. A reused answer never becomes the reference: the
next comparison is still against the input that was really inferred, so a slow drift
adds up and is caught once it passes `max_change`.

Inputs are compared in the model's float input units: after the route's preprocessing,
before INT8 quantization. Those are the units the model was trained in (usually
standardized, so one epsilon fits every channel), and unlike the INT8 tensor they do
not depend on the quantization scale of the model file, so `max_change` keeps its
meaning when a retrained model is swapped in. It differs from the exact-match result
cache (daemon/cache/result_cache.py), which only catches inputs that quantize to the same tensor.

The devices are an LRU bounded by `devices`; one lock guards a route's state, so
several workers may handle the same device at once. A result computed for an older
request never replaces one for a newer request of the same device.

It is cheap on purpose, since a hit saves only one row's quantize and invoke: a request
served alone (the lightly loaded case) takes a path without lists or stacking, the rows
of a bigger batch that have a usable entry are compared in one vectorized step, a route
that remembers nothing yet skips the comparison, and an entry is a named tuple holding its
row: a lone request's own arrays, handed over by the pipeline, or a private copy of a
batch's row (a batch's arrays are the caller's, and one row must not keep them alive).

A batch consults it only for a model whose per-sample invoke cost (measured at warm-up)
reaches BATCH_MIN_COST_S: in a batch a hit saves just its row's share of the invoke (the
fixed cost is paid for the other rows anyway), and on a cheap model that is less than the
row's bookkeeping. Such a batch `forget`s its devices instead, so that no later request
is compared with an input older than its device's last inferred one.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import NamedTuple, Optional, Sequence

import numpy as np

from daemon.config.reuse import ReuseConfig

_MAX = np.maximum.reduce
# A batched row's bookkeeping (compare, copy, LRU) cost ~3 µs on the 2-core x86 measured in
# docs/performance.md; a batched hit saves about cost_per_sample_s. From 10 µs a sample,
# reuse pays in a batch from a hit rate of about 30%. The bundled activity model costs
# 0.5 µs a sample (its invoke's fixed cost is 4 µs), the appliance model 69 µs.
BATCH_MIN_COST_S = 10e-6


class _Entry(NamedTuple):
    model_sha256: str  # a reloaded model's results are never served for the old one's
    x: np.ndarray  # the inferred float input (after preprocessing): never handed out
    scores: np.ndarray  # read-only: match hands it out
    received_at: float  # of the request it was computed for: older ones never replace newer
    computed_at: float  # its age counts from here


class DeviceReuse:
    """match/remember per device for one route; thread-safe; snapshot() for the stats."""

    def __init__(self, config: ReuseConfig):
        self.config = config
        self._lock = threading.Lock()  # guards the LRU and the counters
        self._devices: OrderedDict[str, _Entry] = OrderedDict()
        self._hits = self._misses = self._skipped = 0

    def match(self, devices: Sequence[Optional[str]], x: np.ndarray, model_sha256: str,
              now: float) -> list[Optional[np.ndarray]]:
        """Per row of x (preprocessed float input): the remembered scores to reuse, or None."""
        found: list[Optional[np.ndarray]] = [None] * len(devices)
        hits = 0
        with self._lock:
            rows, entries = self._candidates(devices, x, model_sha256, now) if self._devices else ((), ())
            if rows:
                for row, entry, close in zip(rows, entries, self._close(x, rows, entries)):
                    if close:
                        self._devices.move_to_end(devices[row])
                        found[row] = entry.scores
                        hits += 1
            self._hits += hits
            self._misses += len(found) - hits
        return found

    def match_one(self, device: Optional[str], x: np.ndarray, model_sha256: str, now: float) -> Optional[np.ndarray]:
        """One request served alone (the lightly loaded case, no lists): x is its preprocessed row."""
        with self._lock:
            entry = self._devices.get(device) if device is not None else None
            if entry is not None and self._usable(entry, model_sha256, now, x.shape) and _within(
                    x, entry.x, self.config.max_change):
                self._devices.move_to_end(device)
                self._hits += 1
                return entry.scores
            self._misses += 1
            return None

    def _usable(self, entry: _Entry, model_sha256: str, now: float, shape: tuple) -> bool:
        """Of this model, young enough and of the same shape: worth comparing with."""
        return (entry.model_sha256 == model_sha256 and now - entry.computed_at < self.config.max_age_s
                and entry.x.shape == shape)

    def _candidates(self, devices: Sequence[Optional[str]], x: np.ndarray, model_sha256: str,
                    now: float) -> tuple[list[int], list[_Entry]]:
        """The rows whose device has a usable entry, and those entries."""
        rows, entries, get, shape = [], [], self._devices.get, x.shape[1:]
        for row, device in enumerate(devices):
            entry = get(device) if device is not None else None
            if entry is not None and self._usable(entry, model_sha256, now, shape):
                rows.append(row)
                entries.append(entry)
        return rows, entries

    def _close(self, x: np.ndarray, rows: list[int], entries: list[_Entry]) -> list[bool]:
        """Per candidate row: max |x[row] - entry.x| <= max_change, for all of them at once."""
        diff = (x if len(rows) == len(x) else x[rows]) - np.array([e.x for e in entries])
        diff = diff.reshape(len(rows), -1)
        np.abs(diff, out=diff)
        return (_MAX(diff, axis=1, initial=0.0) <= self.config.max_change).tolist()

    def remember(self, devices: Sequence[Optional[str]], x: np.ndarray, scores: np.ndarray,
                 model_sha256: str, received_at: Sequence[float], now: float) -> None:
        """Rows that were inferred (or found in the result cache) become their device's reference.
        Each row is copied: the batch arrays are the caller's, and one remembered row must not
        keep its whole batch alive (a lone request's own arrays go to `remember_one`)."""
        x = np.asarray(x, dtype=np.float32)
        entries = [(device, _Entry(model_sha256, x[row].copy(), _frozen(scores[row]), received_at[row], now))
                   for row, device in enumerate(devices) if device is not None]
        with self._lock:
            for device, entry in entries:
                self._store(device, entry)

    def remember_one(self, device: Optional[str], x: np.ndarray, scores: np.ndarray, model_sha256: str,
                     received_at: float, now: float) -> None:
        """One inferred row, handed over: the caller never writes x or scores again (they are kept
        as they are, not copied)."""
        if device is not None:
            entry = _Entry(model_sha256, x, _read_only(scores), received_at, now)
            with self._lock:
                self._store(device, entry)

    def _store(self, device: str, entry: _Entry) -> None:
        """Under the lock: the device's new reference, unless it has a newer one; then the LRU bound."""
        old = self._devices.get(device)
        if old is not None and old.received_at > entry.received_at:
            return  # another worker already stored a newer request's result
        self._devices[device] = entry
        self._devices.move_to_end(device)
        while len(self._devices) > self.config.devices:
            self._devices.popitem(last=False)

    def in_batch(self, cost_per_sample_s: float) -> bool:
        """Whether a batch (of more than one row) on a model of this per-sample cost consults reuse."""
        return cost_per_sample_s >= BATCH_MIN_COST_S

    def forget(self, devices: Sequence[Optional[str]]) -> None:
        """A batch that skipped reuse: its devices' references would now be stale."""
        with self._lock:
            if self._devices:  # under steady load nothing is left to forget
                for device in devices:
                    self._devices.pop(device, None)
            self._skipped += len(devices)

    def snapshot(self) -> dict:
        with self._lock:
            return {"devices": len(self._devices), "hits": self._hits, "misses": self._misses,
                    "skipped": self._skipped}


def _within(x: np.ndarray, ref: np.ndarray, max_change: float) -> bool:
    """max |x - ref| <= max_change, for one row; the first element alone settles most misses."""
    if x.size and abs(x.item(0) - ref.item(0)) > max_change:
        return False
    diff = np.subtract(x, ref)
    np.abs(diff, out=diff)
    return float(_MAX(diff, axis=None, initial=0.0)) <= max_change


def _read_only(a: np.ndarray) -> np.ndarray:
    """A read-only view: match hands the scores out, and the owner promised not to write them."""
    view = a.view()
    view.setflags(write=False)
    return view


def _frozen(a: np.ndarray) -> np.ndarray:
    """A private read-only copy: the batch arrays it comes from are reused by the caller."""
    value = a.astype(np.float32)  # always a copy
    value.setflags(write=False)
    return value
