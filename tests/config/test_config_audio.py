"""Audio routes in the config: `input.format: pcm16` needs `input.sample_rate`, and a `log_mel` step
takes it; every mistake names its key and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.config.loader import load_config
from daemon.errors import ConfigError
from daemon.model.log_mel import LogMel

ROOT = Path(__file__).resolve().parents[2]

CONFIG = """\
mqtt: {{broker: localhost}}
models:
  activity:
    path: {root}/models/activity/model.tflite
    labels: {root}/models/activity/labels.txt
routes:
  - name: audio
    subscribe: mic/+/audio
    model: activity
    input:
{input}
    preprocess:
{steps}
    publish: results/{{1}}/audio
"""
PCM16 = "      format: pcm16\n      shape: [16000]\n      sample_rate: 16000"
LOG_MEL = "      - log_mel: {n_fft: 512, hop_length: 160, n_mels: 40}"


def _load(tmp_path: Path, input_text: str = PCM16, steps: str = LOG_MEL, check_models: bool = False):
    path = tmp_path / "audio.yaml"
    path.write_text(CONFIG.format(root=ROOT, input=input_text, steps=steps))
    return load_config(path, check_models=check_models)


def _errors(tmp_path: Path, input_text: str = PCM16, steps: str = LOG_MEL, check_models: bool = False) -> list[str]:
    """The errors, each `{line}` in them being the line of the file they name (read back from it)."""
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, input_text, steps, check_models)
    return list(err.value.errors)


def _line(tmp_path: Path, marker: str) -> int:
    """The line of the written config where `marker` first appears."""
    text = (tmp_path / "audio.yaml").read_text()
    return text[:text.index(marker)].count("\n") + 1


def test_a_pcm16_route_gives_its_sample_rate_to_log_mel(tmp_path):
    route = _load(tmp_path).routes[0]
    assert (route.input.format, route.input.shape, route.input.sample_rate, route.input.dtype) == \
        ("pcm16", (16000,), 16000, "int16")
    (step,) = route.preprocess
    assert isinstance(step, LogMel) and step.sample_rate == 16000 and step.out_shape((16000,)) == (101, 40)


@pytest.mark.parametrize("input_text, error, marker", [
    ("      format: pcm16\n      shape: [16000]",
     "routes[0].input.sample_rate: is required for format pcm16: the audio's rate in Hz, e.g. 16000", "format:"),
    (PCM16.replace("sample_rate: 16000", "sample_rate: 500"),
     "routes[0].input.sample_rate: must be >= 1000, got 500", "sample_rate:"),
    (PCM16.replace("sample_rate: 16000", "sample_rate: 16000.5"),
     "routes[0].input.sample_rate: must be an integer, got 16000.5", "sample_rate:"),
    (PCM16.replace("sample_rate: 16000", "sample_rate: 1000000"),
     "routes[0].input.sample_rate: must be at most 384000 Hz, got 1000000", "sample_rate:"),
    (PCM16.replace("[16000]", "[2, 8000]"),
     "routes[0].input.shape: a pcm16 route takes [samples] (mono audio, one axis), not [2, 8000]", "shape:"),
    (PCM16 + "\n      dtype: float32",
     "routes[0].input.dtype: pcm16 is always little-endian int16, got 'float32'", "dtype:"),
    ("      format: json\n      shape: [16000]\n      sample_rate: 16000",
     "routes[0].input.sample_rate: applies to format pcm16 only", "sample_rate:"),
])
def test_input_mistakes_name_their_key_and_line(tmp_path, input_text, error, marker):
    errors = _errors(tmp_path, input_text, steps="      - clip: {min: -1, max: 1}")
    assert errors == [f"{error} (line {_line(tmp_path, marker)})"]


def test_log_mel_needs_a_rate_and_the_inputs_own(tmp_path):
    json_input = "      format: json\n      shape: [16000]"
    assert _errors(tmp_path, json_input) == [
        "routes[0].preprocess[0]: log_mel: sample_rate is required (or comes from input.sample_rate, "
        f"format pcm16) (line {_line(tmp_path, '- log_mel')})"]
    assert _load(tmp_path, json_input, LOG_MEL.replace("{", "{sample_rate: 8000, ")).routes[0].preprocess[0] \
        .sample_rate == 8000
    assert _errors(tmp_path, steps=LOG_MEL.replace("{", "{sample_rate: 8000, ")) == [
        "routes[0].preprocess[0]: log_mel: sample_rate 8000 differs from input.sample_rate 16000; nothing "
        f"resamples the audio (line {_line(tmp_path, '- log_mel')})"]


def test_a_log_mel_mistake_found_from_the_shape_names_the_step(tmp_path):
    errors = _errors(tmp_path, steps=LOG_MEL.replace("n_mels: 40", "n_mels: 40, win_length: 1024"), check_models=True)
    assert any(e.startswith("routes[0].preprocess: step 0 (log_mel): win_length 1024 is longer than n_fft 512")
               for e in errors), errors
