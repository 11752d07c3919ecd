"""A microphone's stream through openWakeWord's chain, over a real mosquitto: 80 ms pcm16 chunks
(1280 samples at 16 kHz, as openWakeWord's own streaming feeds them) on a stream route whose
windows of 2 s, every 0.25 s, run the melspectrogram, embedding and hey_jarvis models as stages.
Speech is espeak-ng's (tests/speech.py): the wake word is found in a stream that says it, and not
in one that says other words or nothing; each streamed window answers as the same samples do as
a whole clip."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from tests.integration.conftest import burst, write_config
from tests.model.test_stages_chain import SCORE_TOLERANCE, chain_config, direct_scores
from tests.speech import RATE, speech

pytestmark = pytest.mark.integration

CHUNK = 1280  # 80 ms
WINDOW, HOP = 2 * RATE, RATE // 4
FLOOR = 30.0  # a microphone's noise floor, in int16 units (digital silence is not what a microphone sends)
WAKE = 0.5


def stream_config(tmp_path):
    (tmp_path / "base").mkdir()
    raw = yaml.safe_load(chain_config(tmp_path / "base").read_text())
    route = raw["routes"][0]
    route.update(subscribe="mic/+/pcm", publish="wake/{1}",
                 input={"format": "pcm16", "sample_rate": RATE, "shape": [WINDOW], "stream": {"hop": HOP}},
                 preprocess=[{"normalize": {"std": 1 / 32768}}])  # back to int16 units, as the model takes them
    (tmp_path / "base" / "config.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return write_config(tmp_path, base=tmp_path / "base" / "config.yaml")


def said(text: str, seed: int) -> np.ndarray:
    """1 s of floor, `text` (or nothing), then 2 s of floor: int16 samples."""
    voice = speech(text) if text else np.zeros(0, np.int16)
    floor = np.random.default_rng(seed).standard_normal(3 * RATE + len(voice)) * FLOOR
    floor[RATE:RATE + len(voice)] += voice
    return np.clip(np.round(floor), -32768, 32767).astype(np.int16)


def chunks(signal: np.ndarray) -> list[bytes]:
    usable = len(signal) - len(signal) % CHUNK
    return [signal[i:i + CHUNK].astype("<i2").tobytes() for i in range(0, usable, CHUNK)]


def test_the_wake_word_is_found_in_a_stream_that_says_it_and_not_in_other_words_or_silence(
        tmp_path, client, start_daemon):
    start_daemon(stream_config(tmp_path), wait_online=client)
    streams = {"jarvis": said("hey jarvis", 1), "morning": said("good morning", 2), "quiet": said("", 3)}
    client.subscribe("wake/+")
    for device, signal in streams.items():
        burst(client, f"mic/{device}/pcm", chunks(signal))
    best = {}
    for device, signal in streams.items():
        usable = len(signal) - len(signal) % CHUNK
        n = (usable - WINDOW) // HOP + 1
        windows = client.wait_json(f"wake/{device}", n)
        assert [(w["stream"], w["gap"]) for w in windows] == [(device, i == 0) for i in range(n)]
        best[device] = max(w["score"] for w in windows)
        first = signal[:WINDOW].astype(np.float32)  # the first window, as a whole clip, straight to the models
        assert abs(windows[0]["score"] - direct_scores(first)[2].max()) < SCORE_TOLERANCE
    print(f"best hey_jarvis score per stream: {best}")
    assert best["jarvis"] > WAKE and best["morning"] < WAKE and best["quiet"] < WAKE, best
