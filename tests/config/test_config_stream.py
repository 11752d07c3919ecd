"""`input.stream`: read with its defaults, and each wrong use refused by its key path."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from daemon.config.loader import load_config
from daemon.config.stream import DEFAULT_MAX_GAP_MS, DEFAULT_MAX_STREAMS
from daemon.errors import ConfigError


def _route(stream: dict, input_: dict | None = None, **route) -> dict:
    return {"name": "imu", "subscribe": "sensors/+/imu", "model": "activity", "publish": "results/{1}",
            "input": {"format": "json", "shape": [100, 6], **(input_ or {}), "stream": stream}, **route}


def _load(tmp_path: Path, route: dict):
    raw = {"mqtt": {"broker": "localhost:1883"}, "cache": {"dir": str(tmp_path / "cache")},
           "models": {"activity": {"path": "activity.tflite", "labels": "labels.txt"}}, "routes": [route]}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return load_config(path, check_models=False)


def _error(tmp_path: Path, route: dict) -> str:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, route)
    (error,) = caught.value.errors
    return error


def test_the_defaults_make_a_window_of_the_input_shape_every_window(tmp_path):
    stream = _load(tmp_path, _route({})).routes[0].input.stream
    assert (stream.key, stream.window, stream.hop, stream.seq) == (None, 100, 100, None)
    assert (stream.max_gap_ms, stream.max_streams) == (DEFAULT_MAX_GAP_MS, DEFAULT_MAX_STREAMS)


@pytest.mark.parametrize("route, key, words", [
    (_route({"key": -1}), "routes[0].input.stream.key", "a topic level (0 or more) or a JSON field name"),
    (_route({"window": 50}), "routes[0].input.stream.window", "must equal input.shape[0] (100)"),
    (_route({"hop": 0}), "routes[0].input.stream.hop", ">= 1"),
    (_route({"max_gap_ms": 0}), "routes[0].input.stream.max_gap_ms", "must be > 0 or null"),
    (_route({"seq": "n"}, {"format": "raw"}), "routes[0].input.stream.seq", "needs format json"),
    (_route({}, {"format": "npy"}), "routes[0].input.stream", "applies to formats json, raw, pcm16, not npy"),
    (_route({}, coalesce="latest"), "routes[0].coalesce", "does not apply to a stream route"),
    (_route({}, min_interval_ms=10), "routes[0].min_interval_ms", "does not apply to a stream route"),
    (_route({}, escalate={"when": {"score_below": 0.5}, "to_v2": {"url": "http://gpu:8000", "model": "big"}}),
     "routes[0].escalate.to_v2", "use to_model on a stream route"),
    (_route({}, escalate={"when": {"score_below": 0.5}, "to_topic": "gpu/{1}"}),
     "routes[0].escalate.to_topic", "use to_model on a stream route"),
])
def test_a_wrong_stream_is_refused_by_its_key(tmp_path, route, key, words):
    error = _error(tmp_path, route)
    assert error.startswith(f"{key}:") and words in error, error
