"""The `log_mel` preprocess step: mono audio -> a log mel spectrogram of shape (frames, n_mels).

Pure numpy with librosa's arithmetic (0.10 and 0.11): `librosa.feature.melspectrogram` with its
defaults (a periodic Hann window zero-padded to `n_fft`, frames centred by padding the clip with
zeros, Slaney mel scale and area normalization) followed by `librosa.power_to_db` (`log: db`) or by
a natural log of mel + offset (`log: ln`, what TensorFlow-trained keyword spotters take).
librosa itself runs in the tests only (tests/model/test_log_mel.py compares the two).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Optional, Union

import numpy as np

Shape = tuple[int, ...]

LOG_DB, LOG_LN = "db", "ln"
LOG_MODES = (LOG_DB, LOG_LN)
REF_MAX = "max"  # power_to_db(ref=np.max): 0 dB at each clip's loudest bin
NORM_SLANEY = "slaney"
# The Slaney mel scale (librosa.hz_to_mel, htk=False): linear below 1 kHz, logarithmic above.
_SLANEY_HZ_PER_MEL = 200.0 / 3
_SLANEY_LOG_HZ = 1000.0
_SLANEY_LOG_MEL = _SLANEY_LOG_HZ / _SLANEY_HZ_PER_MEL
_SLANEY_LOG_STEP = math.log(6.4) / 27.0
# The HTK mel scale (htk=True): 2595 log10(1 + f / 700).
_HTK_SCALE, _HTK_BREAK_HZ = 2595.0, 700.0
_DB_PER_DECADE = 10.0  # power_to_db: 10 log10 of a power
# Filterbanks kept: one per distinct step config in the routes, so a handful.
_FILTERBANK_CACHE = 32


@dataclass(frozen=True)
class LogMel:
    """Mono audio samples (one axis) to a log mel spectrogram of shape (frames, n_mels), frames
    being 1 + samples // hop_length with `center` (else 1 + (samples - n_fft) // hop_length).
    Parameters are librosa's names and defaults (`sample_rate` is its `sr`): the mel power is
    `librosa.feature.melspectrogram(y, sr=sample_rate, n_fft, hop_length, win_length, center,
    power, n_mels, fmin, fmax, htk, norm)`, Hann window, zero padding. `sample_rate` defaults to the
    route's `input.sample_rate`; `hop_length` to win_length // 4, `win_length` to n_fft, `fmax`
    to sample_rate / 2. Then `log: db` is `librosa.power_to_db(mel, ref, amin, top_db)` (`ref`:
    a number, or `max` for each clip's loudest bin; `top_db` per clip, null for no floor); `log:
    ln` is ln(mel + offset), as openWakeWord and other TensorFlow-trained models take it. The
    mel filterbank is computed once per step, not per request. Transpose for (n_mels, frames)."""

    sample_rate: Optional[int] = None
    n_fft: int = 2048
    hop_length: Optional[int] = None
    win_length: Optional[int] = None
    n_mels: int = 128
    fmin: float = 0.0
    fmax: Optional[float] = None
    power: float = 2.0
    center: bool = True
    htk: bool = False
    norm: Optional[str] = NORM_SLANEY
    log: str = LOG_DB
    ref: Union[float, str] = 1.0
    amin: float = 1e-10
    top_db: Optional[float] = 80.0
    offset: float = 1e-6

    def at_rate(self, input_rate: Optional[int]) -> "LogMel":
        """This step with the route's `input.sample_rate` filled in; ValueError when neither gives a
        rate or the two differ (nothing resamples the audio)."""
        if self.sample_rate is None and input_rate is None:
            raise ValueError("log_mel: sample_rate is required (or comes from input.sample_rate, format pcm16)")
        if self.sample_rate is not None and input_rate is not None and self.sample_rate != input_rate:
            raise ValueError(f"log_mel: sample_rate {self.sample_rate} differs from input.sample_rate "
                             f"{input_rate}; nothing resamples the audio")
        return self if self.sample_rate is not None else replace(self, sample_rate=input_rate)

    @property
    def window_length(self) -> int:
        return self.n_fft if self.win_length is None else self.win_length

    @property
    def hop(self) -> int:
        return self.window_length // 4 if self.hop_length is None else self.hop_length

    @property
    def top_hz(self) -> float:
        return self.sample_rate / 2 if self.fmax is None else float(self.fmax)

    def out_shape(self, shape: Shape) -> Shape:
        self._check()
        if len(shape) != 1:
            raise ValueError(f"log_mel needs mono samples on one axis, got {list(shape)}")
        samples = shape[0] + (2 * (self.n_fft // 2) if self.center else 0)
        if samples < self.n_fft:
            raise ValueError(f"{shape[0]} samples are fewer than n_fft {self.n_fft} (center: false)")
        empty = np.flatnonzero(~_filterbank(self).any(axis=1))
        if empty.size:
            raise ValueError(f"mel band {int(empty[0])} of {self.n_mels} covers no FFT bin: lower n_mels "
                             f"or raise n_fft")
        return (1 + (samples - self.n_fft) // self.hop, self.n_mels)

    def apply(self, batch: np.ndarray) -> np.ndarray:
        mel = _mel_power(self, batch)
        if self.log == LOG_LN:
            return np.log(mel + np.float32(self.offset))
        return _power_to_db(self, mel)

    def _check(self) -> None:
        if self.sample_rate is None:
            raise ValueError("sample_rate is required (or comes from input.sample_rate, format pcm16)")
        _check_ints(self, ("sample_rate", 1), ("n_fft", 2), ("hop_length", 1), ("win_length", 1), ("n_mels", 1))
        _check_choices(self)
        if self.hop < 1:
            raise ValueError(f"win_length {self.window_length} // 4 is no hop: give hop_length")
        if self.window_length > self.n_fft:
            raise ValueError(f"win_length {self.window_length} is longer than n_fft {self.n_fft}")
        if not 0 <= self.fmin < self.top_hz <= self.sample_rate / 2:
            raise ValueError(f"needs 0 <= fmin < fmax <= sample_rate / 2 ({self.sample_rate / 2:g}), "
                             f"got fmin {self.fmin}, fmax {self.top_hz}")
        for name in ("power", "amin", "offset"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.top_db is not None and not self.top_db >= 0:
            raise ValueError(f"top_db must be >= 0 or null, got {self.top_db!r}")


def _check_ints(step: LogMel, *limits: tuple[str, int]) -> None:
    for name, least in limits:
        value = getattr(step, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
            raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")


def _check_choices(step: LogMel) -> None:
    for name in ("center", "htk"):
        if not isinstance(getattr(step, name), bool):
            raise ValueError(f"{name} must be true or false, got {getattr(step, name)!r}")
    if step.log not in LOG_MODES:
        raise ValueError(f"log must be one of {', '.join(LOG_MODES)}, got {step.log!r}")
    if step.norm not in (NORM_SLANEY, None):
        raise ValueError(f"norm must be {NORM_SLANEY} or null, got {step.norm!r}")
    if step.ref != REF_MAX and (isinstance(step.ref, (bool, str)) or not step.ref > 0):
        raise ValueError(f"ref must be a number > 0 or {REF_MAX}, got {step.ref!r}")


def _mel_power(step: LogMel, batch: np.ndarray) -> np.ndarray:
    """(N, samples) -> (N, frames, n_mels) mel power, float32 as librosa computes it."""
    signal = np.asarray(batch, dtype=np.float32)
    if step.center:
        half = step.n_fft // 2
        signal = np.pad(signal, ((0, 0), (half, half)))  # zeros: librosa's pad_mode="constant"
    frames = np.lib.stride_tricks.sliding_window_view(signal, step.n_fft, axis=-1)[:, ::step.hop]
    spectrum = np.fft.rfft(frames * _window(step.n_fft, step.window_length), axis=-1)
    if step.power == 2:  # the usual case: no square root and square again
        power = spectrum.real ** 2 + spectrum.imag ** 2
    else:
        power = np.abs(spectrum) ** np.float32(step.power)
    return (power.astype(np.float32, copy=False) @ _filterbank(step).T).astype(np.float32, copy=False)


def _power_to_db(step: LogMel, mel: np.ndarray) -> np.ndarray:
    """librosa.power_to_db on each clip of the batch (its `ref=np.max` and `top_db` per clip)."""
    amin = np.float32(step.amin)
    db = _DB_PER_DECADE * np.log10(np.maximum(amin, mel))
    if step.ref == REF_MAX:
        ref = np.max(mel, axis=(1, 2), keepdims=True)
    else:
        ref = np.float32(step.ref)
    db -= _DB_PER_DECADE * np.log10(np.maximum(amin, ref))
    if step.top_db is not None:
        db = np.maximum(db, db.max(axis=(1, 2), keepdims=True) - np.float32(step.top_db))
    return db


@lru_cache(maxsize=_FILTERBANK_CACHE)
def _window(n_fft: int, length: int) -> np.ndarray:
    """A periodic Hann window of `length` centred in `n_fft` zeros (librosa's get_window + pad_center)."""
    hann = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(length) / length)
    left = (n_fft - length) // 2
    window = np.pad(hann, (left, n_fft - length - left)).astype(np.float32)
    window.flags.writeable = False  # shared by every request of the route
    return window


@lru_cache(maxsize=_FILTERBANK_CACHE)
def _filterbank(step: LogMel) -> np.ndarray:
    """(n_mels, 1 + n_fft // 2) triangular filters, as librosa.filters.mel builds them."""
    bins = np.fft.rfftfreq(step.n_fft, 1.0 / step.sample_rate)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(step.fmin, step.htk), _hz_to_mel(step.top_hz, step.htk),
                                   step.n_mels + 2), step.htk)
    widths = np.diff(edges)
    ramps = edges[:, None] - bins[None, :]
    rising = -ramps[:-2] / widths[:-1, None]
    falling = ramps[2:] / widths[1:, None]
    weights = np.maximum(0, np.minimum(rising, falling))
    if step.norm == NORM_SLANEY:  # each filter's area the same: 2 / its width in Hz
        weights *= (2.0 / (edges[2:] - edges[:-2]))[:, None]
    weights = weights.astype(np.float32)
    weights.flags.writeable = False
    return weights


def _hz_to_mel(hz: float, htk: bool) -> float:
    if htk:
        return _HTK_SCALE * math.log10(1.0 + hz / _HTK_BREAK_HZ)
    if hz < _SLANEY_LOG_HZ:
        return hz / _SLANEY_HZ_PER_MEL
    return _SLANEY_LOG_MEL + math.log(hz / _SLANEY_LOG_HZ) / _SLANEY_LOG_STEP


def _mel_to_hz(mels: np.ndarray, htk: bool) -> np.ndarray:
    if htk:
        return _HTK_BREAK_HZ * (10.0 ** (mels / _HTK_SCALE) - 1.0)
    log_part = _SLANEY_LOG_HZ * np.exp(_SLANEY_LOG_STEP * (mels - _SLANEY_LOG_MEL))
    return np.where(mels >= _SLANEY_LOG_MEL, log_part, mels * _SLANEY_HZ_PER_MEL)
