"""openWakeWord's three models as one route's `stages`, against the same chain computed here with
a plain interpreter: melspectrogram on a whole clip, then the embedding model on every window of
76 mel frames (every 8: 80 ms), scaled as openWakeWord scales them (x / 10 + 2), then hey_jarvis
on every 16 consecutive embeddings. With espeak-ng, on speech as well (skipped without)."""

from __future__ import annotations

import importlib
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from daemon.config.loader import load_config
from daemon.config.model_files import open_model
from daemon.errors import ConfigError
from daemon.model.runtime import BACKENDS, resolve_backend
from daemon.pipeline.request_path import handle_batch
from daemon.pipeline.route_pipeline import Request, route_pipelines
from tests.real_models import real_model
from tests.speech import speech

RATE = 16_000
CLIP = 3 * RATE  # 297 mel frames -> 28 embeddings -> 13 scores
MEL, EMBEDDING, JARVIS = "openwakeword_melspectrogram.tflite", "openwakeword_embedding.tflite", "openwakeword_hey_jarvis.tflite"
EMBED_WINDOW, EMBED_HOP, SCORE_WINDOW = 76, 8, 16
SCORE_TOLERANCE = 1e-4  # XNNPACK's float kernels against the plain interpreter's, through three models


def chain_config(tmp_path: Path, stages: list | None = None, **route) -> Path:
    """A route whose model is the melspectrogram on a clip of raw float32 samples, and its stages."""
    (tmp_path / "jarvis.txt").write_text("hey_jarvis\n")
    default = [{"model": "embedding", "window": {"size": EMBED_WINDOW, "hop": EMBED_HOP},
                "preprocess": [{"normalize": {"mean": -20.0, "std": 10.0}},  # x / 10 + 2, as openWakeWord does
                               {"reshape": {"shape": [EMBED_WINDOW, 32, 1]}}]},
               {"model": "jarvis", "window": {"size": SCORE_WINDOW, "hop": 1}}]
    raw = {"mqtt": {"broker": "localhost:1883"}, "cache": {"dir": str(tmp_path / "cache")},
           "models": {"mel": {"path": str(real_model(MEL)), "max_batch": 1},  # one clip's clamp is its own
                      "embedding": {"path": str(real_model(EMBEDDING))},
                      "jarvis": {"path": str(real_model(JARVIS)), "labels": str(tmp_path / "jarvis.txt")}},
           "routes": [{"name": "wake", "subscribe": "audio/+/clip", "model": "mel", "publish": "wake/{1}",
                       "input": {"format": "raw", "shape": [CLIP], "dtype": "float32"},
                       "output": {"kind": "classify", "top_k": 1},
                       "stages": default if stages is None else stages, **route}]}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def daemon_replies(config_path: Path, clips: list[np.ndarray]) -> list[dict]:
    config = load_config(config_path)
    models = {name: open_model(config, name) for name in config.models}
    (pipe,) = route_pipelines(config, models)
    requests = [Request(clip.astype("<f4").tobytes(), time.monotonic()) for clip in clips]
    return handle_batch(pipe, requests, models["mel"], None, time.monotonic,
                        stage_models=[models["embedding"], models["jarvis"]]).replies


def _invoke(name: str, x: np.ndarray) -> np.ndarray:
    interp = importlib.import_module(BACKENDS[resolve_backend()]).Interpreter(model_path=str(real_model(name)))
    interp.resize_tensor_input(interp.get_input_details()[0]["index"], list(x.shape))
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x.astype(np.float32))
    interp.invoke()
    return interp.get_tensor(interp.get_output_details()[0]["index"])


def direct_scores(clip: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mel frames, embeddings, scores) of the chain, one invoke per window."""
    mel = _invoke(MEL, clip[None])[0, 0]  # (297, 32)
    starts = range(0, len(mel) - EMBED_WINDOW + 1, EMBED_HOP)
    embeddings = np.stack([_invoke(EMBEDDING, (mel[s:s + EMBED_WINDOW] / 10 + 2)[None, :, :, None]).ravel()
                           for s in starts])
    scores = np.array([_invoke(JARVIS, embeddings[s:s + SCORE_WINDOW][None]).item()
                       for s in range(len(embeddings) - SCORE_WINDOW + 1)])
    return mel, embeddings, scores


def _noise(seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(CLIP) * 2000).astype(np.float32)


def test_the_daemons_chain_answers_each_window_as_the_models_do_directly(tmp_path):
    clips = [_noise(1), np.zeros(CLIP, np.float32), _noise(2)]  # silence among noise: answered as if alone
    replies = daemon_replies(chain_config(tmp_path, publish_stages=True), clips)
    for clip, reply in zip(clips, replies):
        mel, embeddings, scores = direct_scores(clip)
        got = np.array([w["score"] for w in reply["windows"]])
        assert got.shape == scores.shape == (13,)
        np.testing.assert_allclose(got, scores, atol=SCORE_TOLERANCE)
        assert reply["window"] == int(np.argmax(got)) and reply["label"] == "hey_jarvis"
        first, second = reply["stages"]
        assert (first["model"], first["shape"], first["left_out"]) == ("mel", [297, 32], {"values": [297, 32]})
        assert (second["model"], second["frames"], second["shape"]) == ("embedding", 28, [28, 96])
        np.testing.assert_allclose(second["values"], embeddings, atol=1e-3, rtol=1e-4)


def test_a_window_that_does_not_fit_the_stages_model_is_refused_naming_the_key_and_both_shapes(tmp_path):
    unshaped = [{"model": "embedding", "window": {"size": EMBED_WINDOW, "hop": EMBED_HOP}},
                {"model": "jarvis", "window": {"size": SCORE_WINDOW, "hop": 1}}]
    with pytest.raises(ConfigError) as err:
        load_config(chain_config(tmp_path, unshaped))
    (line,) = [e for e in err.value.errors if e.startswith("routes[0].stages[0].window.size:")]
    assert "[76, 32]" in line and "takes [76, 32, 1]" in line


def test_a_window_longer_than_the_previous_stages_frames_is_refused(tmp_path):
    too_long = [{"model": "embedding", "window": {"size": 300, "hop": 1}, "preprocess": [{"reshape": {"shape": [300, 32, 1]}}]}]
    with pytest.raises(ConfigError) as err:
        load_config(chain_config(tmp_path, too_long))
    assert any(e.startswith("routes[0].stages[0].window.size: 300 frames, but the previous stage yields 297")
               for e in err.value.errors)


def spoken(text: str) -> np.ndarray:
    """`text` said by espeak-ng at 16 kHz (tests/speech.py), in int16 units (openWakeWord's),
    centred in a clip of CLIP samples."""
    voice = speech(text).astype(np.float32)[:CLIP]
    clip = np.random.default_rng(0).standard_normal(CLIP).astype(np.float32)  # a microphone's floor, not 0s
    start = (CLIP - len(voice)) // 2
    clip[start:start + len(voice)] = voice
    return clip


def test_speech_through_the_chain_answers_as_the_models_do_directly(tmp_path):
    clips = [spoken("hey jarvis"), spoken("good morning")]
    for clip, reply in zip(clips, daemon_replies(chain_config(tmp_path), clips)):
        np.testing.assert_allclose([w["score"] for w in reply["windows"]], direct_scores(clip)[2],
                                   atol=SCORE_TOLERANCE)
