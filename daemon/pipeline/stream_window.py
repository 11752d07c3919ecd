"""One device's stream of samples -> its windows: a full `window` every `hop` samples.

Pure: no threads, no clocks of its own (the caller passes each message's arrival time), no
MQTT. The caller (daemon/serve/streams.py) keeps one per stream and hands each message's
samples to `push`.

The rules, each said in the windows it returns:
- a window is only ever consecutive samples: a missing `seq` (samples lost) or a silence
  longer than `max_gap_s` starts the window again, and the next window says `gap` with why
  (`seq`: and how many samples were missed; `silence`);
- a stream's first window says `gap` too (`new`): this process has not seen what came before
  (the daemon started, restarted, or evicted the stream);
- samples whose `seq` was already taken (a QoS 1 redelivery, or a sample that came after a later
  one) are dropped and counted, never put in a window twice or out of order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional, Sequence

import numpy as np

NEW, SEQ, SILENCE = "new", "seq", "silence"


class Window(NamedTuple):
    """A full window and what it covers: its samples' first and last seq (None without seq numbers)
    and arrival times; `gap`: why the stream's window started again before it (None: it did not)."""

    data: np.ndarray
    first_seq: Optional[int]
    last_seq: Optional[int]
    first_at: float
    last_at: float
    gap: Optional[str]
    missed: int
    """Samples a seq gap skipped (0 for other gaps, or none)."""


@dataclass
class Pushed:
    """What one message's samples did: the windows they completed, and the samples dropped."""

    windows: list[Window]
    duplicates: int = 0


class StreamWindow:
    """A ring of one window's samples, with each sample's seq and arrival time."""

    __slots__ = ("window", "hop", "max_gap_s", "numbered", "_data", "_seqs", "_times", "_count", "_skip", "_next_seq",
                 "_last_at", "_gap", "_missed")

    def __init__(self, window: int, hop: int, sample_shape: Sequence[int], max_gap_s: Optional[float],
                 numbered: bool):
        """`numbered`: the stream's messages carry seq numbers (windows say their first and last)."""
        self.window, self.hop, self.max_gap_s, self.numbered = window, hop, max_gap_s, numbered
        self._data = np.zeros((window, *sample_shape), np.float32)
        self._seqs = np.zeros(window, np.int64)
        self._times = np.zeros(window, np.float64)
        self._count = 0  # samples held
        self._skip = 0  # samples still to skip before the next window starts (hop > window)
        self._next_seq: Optional[int] = None
        self._last_at: Optional[float] = None
        self._gap: Optional[str] = NEW
        self._missed = 0

    @property
    def nbytes(self) -> int:
        """What this stream holds in memory, beyond the object itself."""
        return self._data.nbytes + self._seqs.nbytes + self._times.nbytes

    def push(self, samples: np.ndarray, seq: Optional[int], at: float) -> Pushed:
        """`samples` (k, *sample_shape), the first numbered `seq` (None: unnumbered), all arrived at `at`."""
        duplicates = 0
        if seq is not None and self._next_seq is not None and seq < self._next_seq:
            duplicates = min(len(samples), self._next_seq - seq)
            samples, seq = samples[duplicates:], seq + duplicates
        if len(samples) == 0:
            return Pushed([], duplicates)
        self._check_gaps(seq, at)
        windows = []
        start = 0
        while start < len(samples):
            start = self._take(samples, start, seq, at)
            if self._count == self.window:
                windows.append(self._emit())
        if seq is not None:
            self._next_seq = seq + len(samples)
        self._last_at = at
        return Pushed(windows, duplicates)

    def _check_gaps(self, seq: Optional[int], at: float) -> None:
        """Start the window again after missing samples or a silence, and remember why."""
        if seq is not None and self._next_seq is not None and seq > self._next_seq:
            self._restart(SEQ, seq - self._next_seq)
        elif self.max_gap_s is not None and self._last_at is not None and at - self._last_at > self.max_gap_s:
            self._restart(SILENCE, 0)

    def _restart(self, why: str, missed: int) -> None:
        self._count, self._skip = 0, 0
        if self._gap is None:  # a stream's first reason stands (`new` before anything else)
            self._gap, self._missed = why, missed
        else:
            self._missed += missed

    def _take(self, samples: np.ndarray, start: int, seq: Optional[int], at: float) -> int:
        """Copy samples from `start` into the ring until it is full or they run out; the next start."""
        if self._skip:
            skipped = min(self._skip, len(samples) - start)
            self._skip -= skipped
            start += skipped
        n = min(self.window - self._count, len(samples) - start)
        if n <= 0:
            return start
        end = self._count + n
        self._data[self._count:end] = samples[start:start + n]
        if seq is not None:
            self._seqs[self._count:end] = np.arange(seq + start, seq + start + n)
        self._times[self._count:end] = at
        self._count = end
        return start + n

    def _emit(self) -> Window:
        """The full window (a copy), then the ring moved on by `hop` samples."""
        first, last = (int(self._seqs[0]), int(self._seqs[-1])) if self.numbered else (None, None)
        window = Window(self._data.copy(), first, last, float(self._times[0]), float(self._times[-1]),
                        self._gap, self._missed)
        self._gap, self._missed = None, 0
        keep = self.window - self.hop
        if keep > 0:
            self._data[:keep] = self._data[self.hop:]
            self._seqs[:keep] = self._seqs[self.hop:]
            self._times[:keep] = self._times[self.hop:]
            self._count = keep
        else:
            self._count, self._skip = 0, -keep
        return window


class StreamItem(NamedTuple):
    """A full window on its way to inference as a request: its stream, its samples, the reply fields
    that say which stream and samples it covers (made on the serving side: daemon/serve/streams.py),
    and the id and timeout of the message that completed it."""

    stream: str
    data: np.ndarray
    fields: dict
    request_id: object = None
    timeout_ms: Optional[float] = None
