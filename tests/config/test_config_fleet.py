"""The `fleet:` section and `models.<m>.managed`: defaults, every mistake with its key path, and a
managed model served from the store's current release."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from daemon.config.loader import load_config
from tests.config.example import config_errors, example_config
from daemon.fleet.release import minisign
from daemon.fleet.controller.publish import make_release
from daemon.fleet.node.store import ModelStore

ROOT = Path(__file__).resolve().parents[2]
KEY = minisign.generate()


def _config(tmp_path: Path, fleet: dict, managed: object = True, **more) -> Path:
    def manage(raw: dict) -> None:
        raw["models"]["activity"]["managed"] = managed

    return example_config(tmp_path, manage, fleet=fleet, **more)


def test_the_fleet_is_off_by_default_and_documented_defaults_hold():
    config = load_config(ROOT / "config.yaml", check_models=False)
    fleet = config.fleet
    assert not fleet.enabled and fleet.threshold == 1 and fleet.keep == 3 and fleet.activation == "auto"
    assert fleet.canary.max_psi == 0.25 and fleet.gate.max_drop_vs_current == 0.02
    assert not any(mc.managed for mc in config.models.values())


def test_a_key_line_is_kept_and_a_pub_file_is_made_absolute(tmp_path):
    path = _config(tmp_path, {"enabled": True, "trusted_keys": [KEY.public_key.line, "keys/ops.pub"],
                              "store_dir": str(tmp_path / "store")})
    fleet = load_config(path, check_models=False).fleet
    assert fleet.trusted_keys == (KEY.public_key.line, str(tmp_path / "keys/ops.pub"))


@pytest.mark.parametrize("fleet, managed, words", [
    ({"enabled": True, "trusted_keys": []}, True, "fleet.trusted_keys: lists 0 key(s) but fleet.threshold is 1"),
    ({"enabled": True, "trusted_keys": ["RW" + "A" * 54], "threshold": 2}, True, "fleet.trusted_keys: lists 1"),
    ({"enabled": True, "trusted_keys": ["k.pub"], "groups": ["a/b"]}, True, "fleet.groups: each group must be"),
    ({"enabled": True, "trusted_keys": ["k.pub"], "groups": ["a", "a"]}, True, "fleet.groups: lists a group twice"),
    ({"enabled": True, "trusted_keys": ["k.pub"], "activation": "later"}, True, "fleet.activation: must be one of"),
    ({"enabled": True, "trusted_keys": ["k.pub"], "keep": 1}, True, "fleet.keep: must be >= 2"),
    ({"enabled": True, "trusted_keys": ["k.pub"], "canary": {"max_psi": -1}}, True, "fleet.canary.max_psi"),
    ({"enabled": True, "trusted_keys": ["k.pub"], "canary": {"max_latency_ratio": 0.5}}, True,
     "fleet.canary.max_latency_ratio: must be >= 1"),
    ({"enabled": True, "trusted_keys": ["k.pub"], "fetch": {"attempts": 0}}, True, "fleet.fetch.attempts"),
    ({"enabled": True, "trusted_keys": ["k.pub"], "gate": {"colour": 1}}, True, "fleet.gate.colour: unknown key"),
    ({"enabled": True, "trusted_keys": ["k.pub"]}, False, "fleet.enabled: no model has managed: true"),
    ({"enabled": False}, True, "models.activity.managed: needs fleet.enabled: true"),
    ({"enabled": True, "trusted_keys": ["k.pub"]}, "yes", "models.activity.managed: must be"),
])
def test_each_mistake_is_named_by_its_key(tmp_path, fleet, managed, words):
    assert words in config_errors(_config(tmp_path, {**fleet, "store_dir": str(tmp_path / "store")}, managed))


def test_worker_processes_are_refused_with_the_fleet(tmp_path):
    path = _config(tmp_path, {"enabled": True, "trusted_keys": ["k.pub"]}, workers={"processes": 2})
    assert "fleet.enabled: needs workers.processes 1 (got 2)" in config_errors(path)


def test_a_managed_model_with_a_pin_is_refused(tmp_path):
    path = _config(tmp_path, {"enabled": True, "trusted_keys": ["k.pub"]})
    raw = yaml.safe_load(path.read_text())
    raw["models"]["activity"]["sha256"] = "0" * 64
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert "models.activity.sha256: a managed model is pinned by its release's signed manifest" in config_errors(path)


def test_a_managed_model_serves_the_current_release_pinned_to_its_manifest(tmp_path):
    store_dir = tmp_path / "store"
    path = _config(tmp_path, {"enabled": True, "trusted_keys": [KEY.public_key.line], "store_dir": str(store_dir)})
    before = load_config(path, check_models=False).models["activity"]
    assert before.path == ROOT / "models/activity/model.tflite" and before.release is None
    store = ModelStore(store_dir, "activity")
    make_release(store.incoming(4), "activity", "1.4.0", 4, ROOT / "models/activity/model.tflite",
                 ROOT / "models/activity/labels.txt", KEY)
    store.admit(4)
    store.activate(4)
    after = load_config(path).models["activity"]  # the models checked too: the release's files load
    manifest = json.loads((store_dir / "activity/releases/4/manifest.json").read_text())
    assert after.path == (store_dir / "activity/releases/4/model.tflite").resolve() and after.release == 4
    assert after.sha256 == next(f["sha256"] for f in manifest["files"] if f["name"] == "model.tflite")
    assert after.labels == (store_dir / "activity/releases/4/labels.txt").resolve()
