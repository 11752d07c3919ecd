"""The `log_mel` step against librosa (the tests' reference, never run by the daemon) on real speech.

Tolerances: within 1e-3 dB for `log: db` and 1e-3 for `log: ln` (the step and librosa both compute
in float32; measured with librosa 0.11.0: at most 1.7e-4 dB, and 2e-6 in ln, on espeak-ng speech).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from daemon.model import log_mel, preprocess
from daemon.model.log_mel import LogMel
from tests.speech import RATE, speech

ROOT = Path(__file__).resolve().parents[2]
DB_TOLERANCE = 1e-3
LN_TOLERANCE = 1e-3
PHRASE = "hey jarvis, turn on the kitchen lights"
# A keyword spotter's front end: 25 ms Hann windows every 10 ms, 40 bands over speech's range.
KWS = {"n_fft": 512, "hop_length": 160, "win_length": 400, "n_mels": 40, "fmin": 20.0, "fmax": 7600.0}
PARAMS = {
    "librosa-defaults": {},
    "keyword-spotting": KWS,
    "htk-unnormalized-magnitude": {**KWS, "n_mels": 32, "htk": True, "norm": None, "power": 1.0},
    "not-centred": {**KWS, "center": False},
    "ref-max-no-floor": {**KWS, "ref": "max", "top_db": None},
    "odd-n_fft": {"n_fft": 401, "hop_length": 100, "n_mels": 20},
}


def _clip() -> np.ndarray:
    return speech(PHRASE).astype(np.float32) / 32768


def _ours(params: dict, clips: np.ndarray) -> np.ndarray:
    step = preprocess.parse_step({"log_mel": params}, RATE)
    out = preprocess.apply_steps([step], clips)
    assert out.shape[1:] == step.out_shape(clips.shape[1:]) and out.dtype == np.float32
    return out


def _librosa_mel(params: dict, clip: np.ndarray) -> np.ndarray:
    librosa = pytest.importorskip("librosa")
    keys = ("n_fft", "hop_length", "win_length", "n_mels", "fmin", "fmax", "power", "center", "htk", "norm")
    return librosa.feature.melspectrogram(y=clip, sr=RATE, **{k: params[k] for k in keys if k in params})


def _librosa_db(params: dict, clip: np.ndarray) -> np.ndarray:
    import librosa

    ref = np.max if params.get("ref") == "max" else params.get("ref", 1.0)
    return librosa.power_to_db(_librosa_mel(params, clip), ref=ref, top_db=params.get("top_db", 80.0)).T


@pytest.mark.parametrize("name", list(PARAMS))
def test_log_db_matches_librosa_on_speech(name):
    clip = _clip()
    expected = _librosa_db(PARAMS[name], clip)
    ours = _ours(PARAMS[name], clip[None])[0]
    assert ours.shape == expected.shape  # (frames, n_mels): librosa's (n_mels, frames) transposed
    assert np.abs(ours - expected).max() < DB_TOLERANCE


@pytest.mark.parametrize("name", ["librosa-defaults", "keyword-spotting"])
def test_log_ln_is_the_natural_log_of_librosas_mel_plus_offset(name):
    clip = _clip()
    offset = 1e-3
    expected = np.log(_librosa_mel(PARAMS[name], clip).T + offset)
    ours = _ours({**PARAMS[name], "log": "ln", "offset": offset}, clip[None])[0]
    assert np.abs(ours - expected).max() < LN_TOLERANCE


def test_the_top_db_floor_and_ref_max_apply_to_each_clip_of_a_batch():
    loud = _clip()
    quiet = np.concatenate([np.zeros(RATE // 2, np.float32), loud[: len(loud) - RATE // 2] * 0.01])
    params = {**KWS, "ref": "max", "top_db": 60.0}
    batch = _ours(params, np.stack([loud, quiet]))
    for clip, ours in zip((loud, quiet), batch):
        expected = _librosa_db(params, clip)
        assert expected.min() == expected.max() - 60.0  # the silence is floored: the floor is exercised
        assert np.abs(ours - expected).max() < DB_TOLERANCE


@pytest.mark.filterwarnings("ignore:n_fft=512 is too large")  # librosa's, for the clips shorter than n_fft
def test_frames_follow_librosas_count_for_any_length():
    for samples in (400, 511, 512, 12000, 16000):
        for center in (True, False):
            step = LogMel(sample_rate=RATE, center=center, **{k: v for k, v in KWS.items() if k != "center"})
            if not center and samples < step.n_fft:
                with pytest.raises(ValueError, match="fewer than n_fft"):
                    step.out_shape((samples,))
                continue
            expected = _librosa_mel({**KWS, "center": center}, np.zeros(samples, np.float32)).shape[::-1]
            assert step.out_shape((samples,)) == expected


def test_the_filterbank_is_built_once_per_step():
    step = preprocess.parse_step({"log_mel": KWS}, RATE)
    clip = _clip()[None]
    preprocess.apply_steps([step], clip)
    before = log_mel._filterbank.cache_info()
    preprocess.apply_steps([step], clip)
    after = log_mel._filterbank.cache_info()
    assert after.misses == before.misses and after.hits == before.hits + 1


def test_sample_rate_comes_from_the_input_and_must_agree_with_it():
    assert preprocess.parse_step({"log_mel": {}}, RATE).sample_rate == RATE
    assert preprocess.parse_step({"log_mel": {"sample_rate": 8000}}).sample_rate == 8000
    with pytest.raises(ValueError, match="sample_rate is required"):
        preprocess.parse_step({"log_mel": {}})
    with pytest.raises(ValueError, match="sample_rate 8000 differs from input.sample_rate 16000"):
        preprocess.parse_step({"log_mel": {"sample_rate": 8000}}, RATE)


@pytest.mark.parametrize("params, shape, message", [
    ({"win_length": 600, "n_fft": 512}, (16000,), "win_length 600 is longer than n_fft 512"),
    ({"fmax": 9000}, (16000,), r"fmin < fmax <= sample_rate / 2 \(8000\)"),
    ({"n_fft": 64, "n_mels": 64}, (16000,), "mel band 0 of 64 covers no FFT bin"),
    ({"log": "log10"}, (16000,), "log must be one of db, ln"),
    ({"n_fft": 512.0}, (16000,), "n_fft must be an integer >= 2, got 512.0"),
    ({"ref": "min"}, (16000,), "ref must be a number > 0 or max"),
    ({"win_length": 3, "n_fft": 8}, (16000,), "give hop_length"),
    ({}, (2, 8000), r"needs mono samples on one axis, got \[2, 8000\]"),
])
def test_bad_parameters_are_named_before_any_audio_arrives(params, shape, message):
    step = preprocess.parse_step({"log_mel": params}, RATE)
    with pytest.raises(ValueError, match=message):
        preprocess.output_shape([step], shape)


def test_the_daemon_computes_it_without_librosa_or_scipy():
    code = ("import sys, numpy as np; from daemon.model import preprocess; "
            "s = preprocess.parse_step({'log_mel': {}}, 16000); preprocess.apply_steps([s], np.zeros((1, 4000))); "
            "print(sorted(m for m in ('librosa', 'scipy', 'numba') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         timeout=120).stdout
    assert out.strip() == "[]"
