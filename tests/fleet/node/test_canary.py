"""The canary's verdict, on two release windows of the model watch (daemon/obs/model_watch.py).
Its latency measure on real invokes under a real load: test_canary_cpu.py."""

from __future__ import annotations

import numpy as np
import pytest

from daemon.config.fleet import CanaryConfig
from daemon.fleet.node import canary, canary_cpu
from daemon.obs.model_watch import ModelWatch, ReleaseWindow

CONFIG = CanaryConfig(duration_s=10, min_answers=300, max_internal_rate=0.01, max_latency_ratio=2.0, max_psi=0.25)
ROUTES = ["r"]


def window(indices=(), scores=None, invoke=(), size=1) -> ReleaseWindow:
    """`invoke`: CPU seconds per sample of each invoke, all of batch size `size` (or (size, seconds) pairs)."""
    scores = scores if scores is not None else [0.9] * len(indices)
    answers = tuple(("r", i, s) for i, s in zip(indices, scores))
    invokes = tuple(v if isinstance(v, tuple) else (size, v) for v in invoke)
    return ReleaseWindow(answers, invokes, len(answers))


def classes(n, shares, seed=0):
    rng = np.random.default_rng(seed)
    return [int(v) for v in rng.choice(len(shares), size=n, p=shares)]


def test_the_same_answers_pass_once_long_enough():
    before = window(classes(500, [0.5, 0.3, 0.2], 1), invoke=[1e-3] * 250)
    after = window(classes(400, [0.5, 0.3, 0.2], 2), invoke=[1.1e-3] * 250)
    assert canary.judge(CONFIG, after, before, 0, 5.0, ROUTES).outcome == canary.WAIT
    verdict = canary.judge(CONFIG, after, before, 0, 10.0, ROUTES)
    assert verdict.outcome == canary.PASS
    assert verdict.figures["psi"] < 0.1 and verdict.figures["latency_ratio"] == pytest.approx(1.1)


def test_permuted_labels_fail_on_psi_before_the_duration():
    before = window(classes(500, [0.6, 0.3, 0.1], 1))
    after = window([{0: 2, 1: 0, 2: 1}[i] for i in classes(300, [0.6, 0.3, 0.1], 2)])
    verdict = canary.judge(CONFIG, after, before, 0, 1.0, ROUTES)
    assert verdict.outcome == canary.FAIL and "PSI" in verdict.reason


def test_too_few_answers_judge_no_psi():
    verdict = canary.judge(CONFIG, window([2] * 50), window([0] * 500), 0, 1.0, ROUTES)
    assert verdict.outcome == canary.WAIT and verdict.figures["psi"] is None


def test_internal_errors_fail():
    verdict = canary.judge(CONFIG, window([0] * 100), window([0] * 100), 5, 1.0, ROUTES)
    assert verdict.outcome == canary.FAIL and "internal" in verdict.reason


def test_a_slower_release_fails_on_its_cpu_time_per_sample():
    verdict = canary.judge(CONFIG, window([0] * 10, invoke=[3e-3] * 200), window([0] * 10, invoke=[1e-3] * 200), 0,
                           1.0, ROUTES)
    assert verdict.outcome == canary.FAIL and "CPU time per sample is 3.00x" in verdict.reason
    assert verdict.figures["latency_invokes"] == 200


def test_batch_sizes_are_compared_with_their_own():
    """A busy node's previous window: mostly batches of 8 (5 us a sample), some of 1 (12 us); the
    new release on a quiet node: batches of 1 at 12.5 us. Pooled, the median would read 2.5x."""
    before = window([0] * 10, invoke=[(8, 5e-6)] * 300 + [(1, 12e-6)] * 150)
    after = window([0] * 10, invoke=[(1, 12.5e-6)] * 150)
    verdict = canary.judge(CONFIG, after, before, 0, 1.0, ROUTES)
    assert verdict.outcome == canary.WAIT and verdict.figures["latency_ratio"] == pytest.approx(12.5 / 12, abs=1e-3)
    assert verdict.figures["latency_invokes"] == 150


def test_a_batch_size_run_too_few_times_is_left_out():
    few = canary_cpu.BUCKET_MIN_INVOKES - 1
    before = window([0] * 10, invoke=[(1, 1e-5)] * 100 + [(8, 1e-6)] * few)
    after = window([0] * 10, invoke=[(1, 1e-5)] * 100 + [(8, 9e-6)] * few)  # 9x, but in too few invokes
    verdict = canary.judge(CONFIG, after, before, 0, 1.0, ROUTES)
    assert verdict.figures["latency_ratio"] == 1.0 and verdict.figures["latency_invokes"] == 100


def test_short_of_the_minimums_a_canary_passes_and_says_what_it_did_not_judge():
    config = CanaryConfig(duration_s=10, min_answers=30)
    before = window(classes(500, [0.5, 0.5], 1), invoke=[1e-5] * 500)
    verdict = canary.judge(config, window([2] * 30, invoke=[9e-5] * 30), before, 0, 10.0, ROUTES)
    assert verdict.outcome == canary.PASS
    assert verdict.figures["latency_ratio"] is None and verdict.figures["psi"] is None
    assert verdict.figures["not_judged"] == [
        f"latency: 30 of {canary_cpu.LATENCY_MIN_INVOKES} invokes compared (new release 30, previous 500)",
        f"PSI of route 'r': 30 of {canary.PSI_MIN_ANSWERS} answers (new release 30, previous 500)"]
    assert verdict.reason == "30 answers in 10 s; not judged: " + "; ".join(verdict.figures["not_judged"])


def test_anomaly_scores_are_compared_in_the_previous_deciles():
    rng = np.random.default_rng(3)
    before = window([None] * 500, list(rng.normal(1.0, 0.1, 500)))
    same = window([None] * 400, list(rng.normal(1.0, 0.1, 400)))
    shifted = window([None] * 400, list(rng.normal(1.5, 0.1, 400)))
    assert canary.judge(CONFIG, same, before, 0, 10.0, ROUTES).outcome == canary.PASS
    assert canary.judge(CONFIG, shifted, before, 0, 1.0, ROUTES).outcome == canary.FAIL


def test_without_a_previous_window_only_the_internal_rate_is_judged():
    verdict = canary.judge(CONFIG, window([1] * 400, invoke=[1.0] * 400), window(), 0, 10.0, ROUTES)
    assert verdict.outcome == canary.PASS and verdict.figures["psi"] is None and verdict.figures["latency_ratio"] is None
    assert "not judged: latency: 0 of" in verdict.reason


def test_the_watch_credits_each_release_and_forgets_on_request():
    watch = ModelWatch()
    watch.observe([("aaa", "r", 1, 0.9), ("bbb", "r", 0, 0.8), ("aaa", "r", 2, 0.7)])
    watch.invoked("aaa", [(4, 0.004), (1, 0.002)])
    assert watch.window("aaa").seen == 2 and watch.window("aaa").invokes == ((4, 0.001), (1, 0.002))
    assert watch.window("bbb").answers == (("r", 0, 0.8),)
    watch.forget("aaa")
    assert watch.window("aaa").seen == 0
