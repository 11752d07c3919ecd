"""`then:` on a detect route: read with its defaults, and each wrong use refused by its key path."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import pytest
import yaml

from daemon.config.loader import load_config
from daemon.config.then import DEFAULT_MAX_CROPS, DEFAULT_PAD, DEFAULT_THEN_MIN_SCORE
from daemon.errors import ConfigError


def _detect(then: Optional[dict], **route) -> dict:
    entry = {"name": "cam", "subscribe": "cameras/+/jpeg", "model": "ssd", "publish": "results/{1}",
             "input": {"format": "image", "shape": [300, 300, 3], "dtype": "uint8"},
             "output": {"kind": "detect"}, **route}
    if then is not None:
        entry["then"] = then
    return entry


def _classify(**route) -> dict:
    return {"name": "cls", "subscribe": "crops/+/jpeg", "model": "effnet", "publish": "crops/{1}/result",
            "input": {"format": "image", "shape": [224, 224, 3], "dtype": "uint8"}, **route}


def _write(tmp_path: Path, routes: list) -> Path:
    raw = {"mqtt": {"broker": "localhost:1883"}, "cache": {"dir": str(tmp_path / "cache")},
           "models": {"ssd": {"path": "ssd.tflite", "labels": "coco.txt"},
                      "effnet": {"path": "effnet.tflite", "labels": "imagenet.txt"}},
           "routes": routes}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _errors(tmp_path: Path, routes: list) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(_write(tmp_path, routes), check_models=False)
    return caught.value.errors


def test_then_is_read_with_its_defaults_and_its_keys(tmp_path):
    config = load_config(_write(tmp_path, [_detect({"route": "cls"}), _classify()]), check_models=False)
    then = config.routes[0].then
    assert (then.route, then.pad, then.max_crops, then.min_score) == ("cls", DEFAULT_PAD, DEFAULT_MAX_CROPS,
                                                                      DEFAULT_THEN_MIN_SCORE)
    assert config.routes[1].then is None
    given = {"route": "cls", "crop": {"pad": 0.25}, "max_crops": 2, "min_score": 0.6}
    then = load_config(_write(tmp_path, [_detect(given), _classify()]), check_models=False).routes[0].then
    assert (then.pad, then.max_crops, then.min_score) == (0.25, 2, 0.6)


@pytest.mark.parametrize("routes, wanted", [
    ([_detect({"route": "nope"}), _classify()], "routes[0].then.route: no route named 'nope' (line "),
    ([_detect({"route": "other"}), _classify(), _detect(None, name="other", subscribe="o/+")],
     "routes[0].then.route: route 'other' is output.kind detect; a sub-model must be classify (line "),
    ([_detect({"route": "cls"}), _classify(input={"format": "json", "shape": [4]})],
     "routes[0].then.route: route 'cls' takes input.format json; a sub-model must take images (line "),
    ([_detect({"route": "cls"}), _classify(then={"route": "cam"})],
     "routes[1].then: applies to output.kind detect only (it classifies each box), not classify (line "),
    ([_detect({"route": "cls"}, input={"format": "raw", "shape": [300, 300, 3], "dtype": "uint8"}), _classify()],
     "routes[0].then: needs input.format image (the crops are cut from the sent picture), not raw (line "),
    ([_detect({"route": "cls", "model": "effnet"}), _classify()], "routes[0].then.model: unknown key (known: route, crop, max_crops, "),
    ([_detect({"route": "cls", "crop": {"pad": -0.1}}), _classify()], "routes[0].then.crop.pad: must be >= 0"),
    ([_detect({"route": "cls", "max_crops": 0}), _classify()], "routes[0].then.max_crops: must be >= 1"),
    ([_detect({"crop": {"pad": 0.1}}), _classify()], "routes[0].then.route: is required"),
], ids=["unknown-route", "not-classify", "not-images", "classify-with-then", "detect-not-images", "unknown-key",
        "negative-pad", "no-crops", "no-route"])
def test_a_wrong_then_is_refused_naming_its_key(tmp_path, routes, wanted):
    errors = _errors(tmp_path, routes)
    assert any(e.startswith(wanted) for e in errors), errors
    assert len(errors) == 1, errors  # no follow-on error


def test_a_then_route_naming_itself_is_refused(tmp_path):
    """A loop is refused at its first hop: a sub-model classifies, and a classify route has no
    `then` (classify-with-then above), so no chain of `then` can loop."""
    errors = _errors(tmp_path, [_detect({"route": "cam"})])
    assert list(errors) == ["routes[0].then.route: route 'cam' is output.kind detect; a sub-model must be classify "
                      f"(line {_line(tmp_path, '    route: cam')})"]


def _line(tmp_path: Path, text: str) -> int:
    body = (tmp_path / "config.yaml").read_text()
    return body[: body.index(text)].count("\n") + 1
