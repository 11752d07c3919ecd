"""Reload planning and the child-process check, on copies of the bundled config."""

from __future__ import annotations

import re
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from daemon.lifecycle import reload
from daemon.lifecycle.service import Service
from daemon.lifecycle.steps import StepName
from daemon.config.loader import load_config
from daemon.model.runtime import file_sha256, resolve_backend

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def config(tmp_path):
    """The example config next to copies of its models (so the test may change them)."""
    shutil.copytree(ROOT / "models", tmp_path / "models")
    shutil.copy(ROOT / "config.yaml", tmp_path / "config.yaml")
    return load_config(tmp_path / "config.yaml", check_models=False)


def _loaded(config) -> dict:
    return {name: reload.fingerprint(config, name) for name in config.models}


def test_nothing_changed_plans_nothing(config):
    change = reload.plan(config, config, _loaded(config))
    assert not change.changed and change.ignored == ()


def test_a_changed_labels_file_or_model_file_is_a_hot_swap_of_that_model(config):
    loaded = _loaded(config)
    config.models["activity"].labels.write_text("a\nb\nc\nd\n")
    assert reload.plan(config, config, loaded) == reload.Plan(
        frozenset({"activity"}), None, {n: file_sha256(m.path) for n, m in config.models.items()})
    with open(config.models["appliance"].path, "ab") as f:
        f.write(b"\0")
    assert reload.plan(config, config, loaded).changed_models == {"activity", "appliance"}


@pytest.mark.parametrize("change, first", [
    (lambda c: replace(c, routes=(replace(c.routes[0], publish="results/{1}/v2"), *c.routes[1:])), "serving"),
    (lambda c: replace(c, mqtt=replace(c.mqtt, broker="otherhost:1883")), "serving"),
    (lambda c: replace(c, workers=replace(c.workers, max=c.workers.max + 1)), "serving"),
    (lambda c: replace(c, homeassistant=replace(c.homeassistant, discovery=True)), "serving"),
    (lambda c: replace(c, http=replace(c.http, port=8000)), "http"),
    (lambda c: replace(c, cache=replace(c.cache, max_mb=1)), "cache"),
    (lambda c: replace(c, xnnpack=not c.xnnpack), "models"),
    (lambda c: replace(c, models={k: v for k, v in c.models.items() if k == "activity"}), "models"),
])
def test_other_changes_restart_from_the_first_step_they_affect(config, change, first):
    restart_from = reload.plan(config, change(config), _loaded(config)).restart_from
    assert restart_from == first and isinstance(restart_from, StepName)


def test_every_step_name_reload_can_plan_is_a_step_the_service_can_restart_from(config):
    """Reload names steps by `StepName`, and the service lists exactly one step per name, in
    the enum's order: a renamed or removed step breaks this test, not a reload in the field."""
    steps = Service(config).steps()
    assert [step.name for step in steps] == list(StepName)
    assert all(isinstance(step.name, StepName) for step in steps)


def test_a_metrics_change_is_reported_as_needing_a_restart(config):
    new = replace(config, metrics=replace(config.metrics, port=9999))
    change = reload.plan(config, new, _loaded(config))
    assert change.ignored == ("metrics",) and not change.changed


def test_the_child_check_passes_a_good_config_and_names_the_problem_of_a_bad_model(config):
    assert reload.verify(config.source) is None
    model = config.models["activity"].path
    model.write_bytes(model.read_bytes()[:1000])
    problem = reload.verify(config.source)
    assert problem is not None
    if resolve_backend() == "tflite" and problem.startswith("killed by signal 11: "):
        return  # tflite-runtime 2.14 (armv7's) segfaults on a truncated model, on x86-64 too: what the child is for
    assert problem.startswith("exit 78") and "models.activity.path" in problem


def test_a_child_that_crashes_natively_is_a_failed_check_not_a_crash_here(config, tmp_path, monkeypatch):
    crasher = tmp_path / "crash.sh"
    crasher.write_text("#!/bin/sh\nkill -SEGV $$\n")
    crasher.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(crasher))
    problem = reload.verify(config.source)
    # Under qemu-user (scripts/check-arm.sh) the emulator adds its own line to the child's stderr.
    assert re.fullmatch(r"killed by signal 11: (qemu: uncaught target signal 11 \(Segmentation fault\) - core dumped)?",
                        problem), problem


def test_the_watchdog_is_fed_while_the_child_checks_and_a_check_past_its_time_is_killed(config, tmp_path,
                                                                                       monkeypatch):
    """The main loop waits on the check: its watchdog (systemd's, or a worker process's heartbeat)
    must still be fed, or a long validate set gets the daemon killed mid-reload."""
    slow = tmp_path / "slow.sh"
    slow.write_text("#!/bin/sh\nsleep 1\n")
    slow.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(slow))
    monkeypatch.setattr(reload, "VERIFY_TICK_S", 0.1)
    fed = []
    assert reload.verify(config.source, while_waiting=lambda: fed.append(1)) is None
    assert len(fed) >= 5
    assert reload.verify(config.source, timeout_s=0.3) == "the model check did not finish within 0.3 s"
