"""The canary's latency check (daemon/fleet/node/canary_probe.py, through canary.judge) on real
models, on a machine made busy here.

Thirty canaries. Each loads, as a node does when a canary starts, a copy of the previous release
(the bundled activity model), of an identical release (the same bytes, loaded again) and of a
build that does the graph five times with the same answers (tests/fixtures/activity_x3,
tools/slower_build.py), and probes each new one against the previous. Two busy loops per core
(one process each, as other nodes on the box are: tests/busy.py) run during two canaries of
three, and are stopped during the third.
"""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import numpy as np
import pytest

from daemon.config.fleet import CanaryConfig
from daemon.config.loader import load_config
from daemon.fleet.node import canary, canary_probe
from daemon.model import preprocess
from daemon.model.runtime import Model
from daemon.obs.model_watch import ReleaseWindow
from tests.busy import BusyLoops

pytestmark = pytest.mark.serial  # busy loops on every core: run alone (scripts/test.sh)

ROOT = Path(__file__).resolve().parents[3]
ACTIVITY = ROOT / "models/activity/model.tflite"
SLOWER = ROOT / "tests/fixtures/activity_x3/model.tflite"
CANARIES = 30
CONFIG = CanaryConfig(duration_s=0, min_answers=0)  # the defaults' max_latency_ratio, 2
# Wall time over CPU time of a busy-loop calibration at least this: the load took the cores.
LOADED_AT_LEAST = 1.2
# Two loops a core: with one, a host whose scheduler favours the woken test thread gave it most of
# a core (wall 1.13-1.24x its CPU time): not the busy box the canary must see through.
LOOPS_PER_CORE = 2


def _copy(path: Path) -> Model:
    return Model(path, max_batch=1)  # as the node's host loads a probe's copy (open_model, max_batch=1)


def _spin(seconds: float) -> tuple[float, float]:
    """Python work for `seconds` of this thread's CPU time: its (wall, CPU) seconds."""
    began, began_cpu = time.perf_counter(), time.thread_time()
    while time.thread_time() - began_cpu < seconds:
        sum(range(1000))
    return time.perf_counter() - began, time.thread_time() - began_cpu


@pytest.fixture(scope="module")
def probed():
    """Per canary: (loaded, the identical release's probe, the slower build's probe); and the
    busy canaries' wall time over CPU time of a spin beside them."""
    canaries, wall, cpu = [], 0.0, 0.0
    load = BusyLoops(count=LOOPS_PER_CORE * (os.cpu_count() or 2))
    try:
        for i in range(CANARIES):
            loaded = i % 3 != 2
            load.set(loaded)
            same = canary_probe.against(_copy(ACTIVITY), lambda: _copy(ACTIVITY))
            slower = canary_probe.against(_copy(ACTIVITY), lambda: _copy(SLOWER))
            if loaded:
                spun = _spin(0.02)
                wall, cpu = wall + spun[0], cpu + spun[1]
            canaries.append((loaded, same, slower))
    finally:
        load.close()
    return canaries, wall / cpu


def _verdict(probe: canary_probe.Probe) -> canary.Verdict:
    empty = ReleaseWindow((), (), 0)
    return canary.judge(CONFIG, empty, empty, 0, 0.0, ["activity"], probe)


def _spread(probes) -> str:
    ratios = [p.ratio for p in probes]
    return f"{min(ratios):.2f}-{max(ratios):.2f}x"


def test_the_slower_build_answers_bit_for_bit_as_the_model_does_and_is_what_its_tool_makes():
    spec = importlib.util.spec_from_file_location("slower_build", ROOT / "tools/slower_build.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    built = tool.slower(ACTIVITY.read_bytes(), tool.COPIES)
    assert built == SLOWER.read_bytes(), "stale: run python tools/slower_build.py"
    model, slower = Model(ACTIVITY, max_batch=8), Model(SLOWER, max_batch=8)
    route = next(r for r in load_config(ROOT / "config.yaml", check_models=False).routes if r.name == "activity")
    with np.load(ACTIVITY.parent / "test.npz") as data:
        q = model.quantize(preprocess.apply_steps(route.preprocess, data["x"].astype(np.float32)))
    assert np.array_equal(model.infer_quantized(q), slower.infer_quantized(q))


def test_the_load_was_real(probed):
    _, wall_over_cpu = probed
    print(f"busy canaries: a spin beside them took {wall_over_cpu:.2f}x its CPU time")
    assert wall_over_cpu >= LOADED_AT_LEAST


def test_thirty_canaries_of_identical_bytes_on_a_busy_machine_roll_back_none(probed):
    canaries, _ = probed
    verdicts = [_verdict(same) for _, same, _ in canaries]
    print(f"identical bytes, {CANARIES} canaries: busy {_spread([s for busy, s, _ in canaries if busy])}, "
          f"quiet {_spread([s for busy, s, _ in canaries if not busy])}; "
          f"pairs {min(s.pairs for _, s, _ in canaries)}-{max(s.pairs for _, s, _ in canaries)}")
    assert [v.outcome for v in verdicts] == [canary.PASS] * CANARIES, [v.reason for v in verdicts]
    assert all(v.figures["latency_ratio"] is not None for v in verdicts)  # judged, every one


def test_a_build_that_does_the_work_five_times_is_rolled_back_every_time(probed):
    canaries, _ = probed
    verdicts = [_verdict(slower) for _, _, slower in canaries]
    print(f"the slower build, {CANARIES} canaries: busy {_spread([s for busy, _, s in canaries if busy])}, "
          f"quiet {_spread([s for busy, _, s in canaries if not busy])}")
    assert [v.outcome for v in verdicts] == [canary.FAIL] * CANARIES, [v.reason for v in verdicts]
    assert all("CPU time per sample" in v.reason for v in verdicts)
