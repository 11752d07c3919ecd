"""`input.format: pcm16`: raw little-endian int16 mono audio, as microphones publish it.

`samples` is the whole decode, pure and for any number of samples, so that a stream can append
each chunk (an 80 ms chunk at 16 kHz: 1280 samples, 2560 bytes) as a whole clip is decoded.
"""

from __future__ import annotations

import numpy as np

from daemon.errors import BAD_PAYLOAD, BAD_SHAPE, PayloadError

PCM16_DTYPE = np.dtype("<i2")
# int16 / 32768: full scale maps onto [-1, 1) exactly (-32768 -> -1.0, 32767 -> 0.99997),
# librosa's and soundfile's convention for float audio.
FULL_SCALE = 32768.0


def samples(payload: bytes) -> np.ndarray:
    """pcm16 bytes -> float32 samples in [-1, 1) (int16 / 32768); bad_payload for an odd byte count."""
    if len(payload) % PCM16_DTYPE.itemsize:
        raise PayloadError(BAD_PAYLOAD, f"pcm16 payload is {len(payload)} bytes: not whole 2-byte samples")
    return np.frombuffer(payload, dtype=PCM16_DTYPE).astype(np.float32) / np.float32(FULL_SCALE)


def clip(payload: bytes, count: int) -> np.ndarray:
    """A whole clip of exactly `count` samples (a route's input.shape); bad_shape otherwise,
    naming the byte count expected, as raw payloads do."""
    expected = count * PCM16_DTYPE.itemsize
    if len(payload) != expected:
        raise PayloadError(BAD_SHAPE, f"pcm16 payload is {len(payload)} bytes; {count} samples need {expected}")
    return samples(payload)
