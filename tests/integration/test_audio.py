"""Audio over a real mosquitto: `input.format: pcm16` whole clips of espeak-ng speech into two of
openWakeWord's real models. 80 ms chunks (1280 samples, as a microphone publishes them) go to its
melspectrogram model, which takes int16-scale floats; 0.75 s clips go through a `log_mel` step to its
speech embedding model, answered as that model answers librosa's features of the same clip."""

from __future__ import annotations

import numpy as np
import pytest

from tests.integration.conftest import write_config
from tests.real_models import real_model
from tests.speech import RATE, speech

interpreter = pytest.importorskip("ai_edge_litert.interpreter")

CHUNK = 1280  # 80 ms at 16 kHz
CLIP = 12_000  # 0.75 s: 1 + 12000 // 160 = 76 frames, the embedding model's window
DEVICES = 3
MEL_PARAMS = {"n_fft": 512, "hop_length": 160, "win_length": 400, "n_mels": 32, "fmin": 60.0, "fmax": 3800.0,
              "log": "ln", "offset": 1e-3}
TOLERANCE = 1e-3  # the models' outputs from the daemon's features and from librosa's / numpy's


def _routes(mel_model, embedding_model) -> tuple[dict, list]:
    models = {"mel": {"path": str(mel_model)}, "embedding": {"path": str(embedding_model)}}
    routes = [
        {"name": "mel", "subscribe": "mic/+/chunk", "model": "mel", "output": {"kind": "values"},
         "input": {"format": "pcm16", "shape": [CHUNK], "sample_rate": RATE},
         "preprocess": [{"normalize": {"std": 1 / 32768}}],  # the model takes int16 values as floats
         "publish": "results/{1}/mel"},
        {"name": "embedding", "subscribe": "mic/+/clip", "model": "embedding", "output": {"kind": "values"},
         "input": {"format": "pcm16", "shape": [CLIP], "sample_rate": RATE},
         "preprocess": [{"log_mel": MEL_PARAMS}, {"reshape": {"shape": [76, 32, 1]}}],
         "publish": "results/{1}/embedding"},
    ]
    return models, routes


def _invoke(path, x: np.ndarray) -> np.ndarray:
    it = interpreter.Interpreter(model_path=str(path))
    it.resize_tensor_input(0, list(x.shape))
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x.astype(np.float32))
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"]).ravel()


def _librosa_features(clip: np.ndarray) -> np.ndarray:
    librosa = pytest.importorskip("librosa")
    keys = ("n_fft", "hop_length", "win_length", "n_mels", "fmin", "fmax")
    mel = librosa.feature.melspectrogram(y=clip / np.float32(32768), sr=RATE, **{k: MEL_PARAMS[k] for k in keys})
    return np.log(mel.T + MEL_PARAMS["offset"]).reshape(1, 76, 32, 1)


def _values(reply: dict) -> np.ndarray:
    assert "error" not in reply, reply
    (values,) = reply["values"].values()
    return np.asarray(values, dtype=np.float32).ravel()


def test_pcm16_clips_reach_real_wake_word_models(tmp_path, client, start_daemon):
    mel_model, embedding_model = real_model("openwakeword_melspectrogram.tflite"), \
        real_model("openwakeword_embedding.tflite")
    voice = speech("hey jarvis, turn on the kitchen lights")
    models, routes = _routes(mel_model, embedding_model)
    start_daemon(write_config(tmp_path, models=models, routes=routes), wait_online=client)
    client.subscribe("results/+/+")
    chunks = [voice[i * CHUNK:(i + 1) * CHUNK] for i in range(DEVICES)]
    clips = [voice[i * CLIP // 2:i * CLIP // 2 + CLIP] for i in range(DEVICES)]  # overlapping 0.75 s clips
    for i in range(DEVICES):  # one device a topic: the replies carry no id, the topic tells them apart
        client.publish(f"mic/{i}/chunk", chunks[i].astype("<i2").tobytes())
        client.publish(f"mic/{i}/clip", clips[i].astype("<i2").tobytes())
    for i in range(DEVICES):
        (mel_reply,) = client.wait_json(f"results/{i}/mel")
        assert mel_reply["id"] is None
        expected = _invoke(mel_model, chunks[i][None].astype(np.float32))
        np.testing.assert_allclose(_values(mel_reply), expected, rtol=TOLERANCE, atol=TOLERANCE)
        (embedding_reply,) = client.wait_json(f"results/{i}/embedding")
        expected = _invoke(embedding_model, _librosa_features(clips[i]))
        np.testing.assert_allclose(_values(embedding_reply), expected, rtol=TOLERANCE, atol=TOLERANCE)


def test_a_clip_of_the_wrong_length_is_answered_bad_shape(tmp_path, client, start_daemon):
    models, routes = _routes(real_model("openwakeword_melspectrogram.tflite"),
                             real_model("openwakeword_embedding.tflite"))
    start_daemon(write_config(tmp_path, models=models, routes=routes), wait_online=client)
    client.subscribe("results/+/mel")
    client.publish("mic/short/chunk", b"\0" * (2 * CHUNK - 2))
    (reply,) = client.wait_json("results/short/mel")
    assert reply["id"] is None and reply["route"] == "mel" and reply["error"]["code"] == "bad_shape"
    assert f"{CHUNK} samples need {2 * CHUNK}" in reply["error"]["message"]
