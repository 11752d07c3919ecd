"""Every bundled model passes `validate` at the 1-point bound, and its card tells the truth."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from daemon.model.runtime import file_sha256

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = [("activity", "config.yaml", "activity"), ("appliance", "config.yaml", "appliance"),
           ("appliance_large", "models/appliance_large/config.yaml", "appliance_large"),
           ("digits", "tests/fixtures/digits/config.yaml", "digits")]


def _dir(name: str, config: str) -> Path:
    return (ROOT / config).parent / ("models/" + name if config == "config.yaml" else "")


@pytest.mark.parametrize("name,config,route", BUNDLED)
def test_validate_passes_at_the_bound_and_matches_the_card(name, config, route):
    model_dir = _dir(name, config)
    card = json.loads((model_dir / "card.json").read_text())
    proc = subprocess.run([sys.executable, "-m", "daemon", "validate", "--config", str(ROOT / config), "--route", route,
                           "--data", str(model_dir / "test.npz"), "--float", str(model_dir / "model_float.tflite"),
                           "--max-drop", "0.01"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["passed"] is True and report["drop"] <= 0.01 + 1e-9
    assert report["accuracy"] == pytest.approx(card["int8_accuracy"], abs=1e-4)
    assert report["float_accuracy"] == pytest.approx(card["float_accuracy"], abs=1e-4)
    assert report["n"] == card["n_test"]
    assert report["model_sha256"] == card["sha256"] == file_sha256(model_dir / "model.tflite")
    assert card["size_bytes"] == (model_dir / "model.tflite").stat().st_size


def test_acsf1_model_is_worth_having():
    card = json.loads((ROOT / "models/appliance/card.json").read_text())
    assert card["float_accuracy"] >= 0.80


def test_validate_exits_1_below_the_gate():
    proc = subprocess.run([sys.executable, "-m", "daemon", "validate", "--config", "config.yaml", "--route", "activity",
                           "--data", "models/activity/test.npz", "--min-accuracy", "1.01"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["passed"] is False


def test_validate_fails_the_gate_when_the_drop_exceeds_max_drop():
    """appliance's INT8 is 0.01 *above* float (0.86 vs 0.85): a max-drop of -0.02 must fail, -0.005 pass."""
    from daemon.config.loader import load_config
    from daemon.pipeline.evaluate import Gate, validate

    config = load_config(ROOT / "config.yaml")
    model_dir = ROOT / "models/appliance"
    args = (config, "appliance", model_dir / "test.npz", model_dir / "model_float.tflite")
    report, ok = validate(*args, gate=Gate(max_drop=-0.02))
    assert not ok and report["drop"] > -0.02
    assert validate(*args, gate=Gate(max_drop=-0.005))[1]
