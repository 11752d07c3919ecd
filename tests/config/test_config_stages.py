"""routes[].stages and publish_stages: read by key (pass 1), then checked across the config (pass 2);
each problem names its key. The checks that need the models loaded are in
tests/model/test_stages_chain.py (real models)."""

from __future__ import annotations

import pytest

from daemon.config.loader import load_config
from daemon.config.stages import StageConfig, WindowConfig, frames_view, next_frames, window_count
from tests.config.example import ROOT, config_errors, example_config


def _with_stages(tmp_path, stages, **route_keys):
    def edit(raw):
        raw["routes"][0]["stages"] = stages
        raw["routes"][0].pop("validate", None)  # the example's gate runs one model: refused with stages
        raw["routes"][0].update(route_keys)
    return example_config(tmp_path, edit)


def test_stages_are_read_in_order_with_their_windows_and_steps(tmp_path):
    stages = [{"model": "appliance", "window": {"size": 4, "hop": 2}, "preprocess": [{"clip": {"min": 0, "max": 1}}]},
              {"model": "activity"}]
    config = load_config(_with_stages(tmp_path, stages, publish_stages=True), check_models=False)
    route = config.routes[0]
    assert [s.model for s in route.stages] == ["appliance", "activity"]
    assert route.stages[0].window == WindowConfig(size=4, hop=2) and route.stages[1].window is None
    assert len(route.stages[0].preprocess) == 1
    assert route.publish_stages and not route.uses_cache  # a cache entry keeps the last output only


def test_a_route_without_stages_is_unchanged(tmp_path):
    route = load_config(example_config(tmp_path), check_models=False).routes[0]
    assert route.stages == () and not route.publish_stages


@pytest.mark.parametrize("stages, message", [
    ([{"model": "nope"}], "routes[0].stages[0].model: unknown model 'nope'"),
    ([{"model": "appliance", "window": {"size": 0, "hop": 1}}], "routes[0].stages[0].window.size: must be >= 1"),
    ([{"model": "appliance", "window": {"size": 4, "hop": 0}}], "routes[0].stages[0].window.hop: must be >= 1"),
    ([{"model": "appliance", "window": {"size": 4}}], "routes[0].stages[0].window.hop: is required"),
    ([{"model": "appliance", "window": {"size": True, "hop": 1}}], "routes[0].stages[0].window.size: must be"),
    ([{"model": "appliance", "windows": {}}], "routes[0].stages[0].windows: unknown key"),
    ([{"window": {"size": 2, "hop": 1}}], "routes[0].stages[0].model: is required"),
    ([{"model": "appliance", "preprocess": [{"nope": {}}]}], "routes[0].stages[0].preprocess[0]: unknown step"),
    ("appliance", "routes[0].stages: must be a list"),
    ([{"model": "appliance"}, "activity"], "routes[0].stages[1]: must be a mapping"),
])
def test_each_problem_of_a_stage_names_its_key(tmp_path, stages, message):
    assert message in config_errors(_with_stages(tmp_path, stages))


def test_publish_stages_needs_stages(tmp_path):
    errors = config_errors(_with_stages(tmp_path, [], publish_stages=True))
    assert "routes[0].publish_stages: needs stages" in errors


@pytest.mark.parametrize("key, value", [("reuse", {"max_change": 0.1, "max_age_s": 1}),
                                        ("escalate", {"when": {"score_below": 0.5}, "to_model": "appliance"}),
                                        ("validate", {"data": str(ROOT / "models/activity/test.npz")})])
def test_keys_that_run_one_model_are_refused_with_stages(tmp_path, key, value):
    errors = config_errors(_with_stages(tmp_path, [{"model": "appliance"}], **{key: value}))
    assert f"routes[0].{key}: cannot be used with stages" in errors


def test_a_chain_answers_classify_or_values_only(tmp_path):
    errors = config_errors(_with_stages(tmp_path, [{"model": "appliance"}], output={"kind": "anomaly"}))
    assert "routes[0].stages: a chain answers output.kind classify or values, not anomaly" in errors


def test_the_frame_rule_squeezes_size_one_axes_and_counts_frames_on_the_first_left():
    assert frames_view((1, 297, 32)) == (297, 32)
    assert frames_view((1, 1, 1, 96)) == (96,)  # a whole output read as frames: 96 of one value
    assert frames_view((1,)) == (1,)  # a single score: one frame of one value
    windowed = StageConfig("m", window=WindowConfig(size=76, hop=8))
    assert next_frames((297, 32), windowed, (1, 1, 96)) == (28, 96)  # one frame per window, squeezed
    assert next_frames((28, 96), StageConfig("m"), (1, 5, 7)) == (5, 7)


@pytest.mark.parametrize("frames, size, hop, count", [(297, 76, 8, 28), (28, 16, 1, 13), (75, 76, 8, 0),
                                                     (76, 76, 8, 1), (10, 3, 5, 2), (10, 2, 2, 5)])
def test_windows_leave_out_the_frames_that_do_not_fill_one(frames, size, hop, count):
    assert window_count(frames, WindowConfig(size, hop)) == count
