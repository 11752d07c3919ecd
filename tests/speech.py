"""Real speech for the audio tests: espeak-ng's voice, as 16 kHz int16 mono (what a microphone
publishes). Tests that need it skip when espeak-ng is absent (scripts/setup.sh installs it)."""

from __future__ import annotations

import functools
import io
import shutil
import subprocess
import wave

import numpy as np
import pytest

RATE = 16_000
_ESPEAK = "espeak-ng"
_TIMEOUT_S = 60


@functools.lru_cache(maxsize=None)
def speech(text: str) -> np.ndarray:
    """`text` spoken by espeak-ng (22,050 Hz), linearly resampled to RATE, as int16 samples."""
    if shutil.which(_ESPEAK) is None:
        pytest.skip(f"{_ESPEAK} is not installed (scripts/setup.sh installs it)")
    wav = subprocess.run([_ESPEAK, "--stdout", text], capture_output=True, check=True, timeout=_TIMEOUT_S).stdout
    with wave.open(io.BytesIO(wav)) as w:
        assert w.getsampwidth() == 2 and w.getnchannels() == 1
        rate = w.getframerate()
        voice = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float64)
    times = np.arange(int(len(voice) * RATE / rate)) / RATE
    out = np.round(np.interp(times, np.arange(len(voice)) / rate, voice)).astype(np.int16)
    out.flags.writeable = False  # cached: shared by every test
    return out
