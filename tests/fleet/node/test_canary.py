"""The canary's verdict, on two release windows of the model watch (daemon/obs/model_watch.py) and
the releases' probe (daemon/fleet/node/canary_probe.py), whose pairing is checked here on models
that report set CPU times. Its latency measure on real models under a real load: test_canary_probe.py."""

from __future__ import annotations

import numpy as np
import pytest

from daemon.config.fleet import CanaryConfig
from daemon.fleet.node import canary, canary_cpu, canary_probe
from daemon.obs.model_watch import ModelWatch, ReleaseWindow

CONFIG = CanaryConfig(duration_s=10, min_answers=300, max_internal_rate=0.01, max_latency_ratio=2.0, max_psi=0.25)
ROUTES = ["r"]


def window(indices=(), scores=None, invoke=(), size=1) -> ReleaseWindow:
    """`invoke`: CPU seconds per sample of each invoke, all of batch size `size` (or (size, seconds) pairs)."""
    scores = scores if scores is not None else [0.9] * len(indices)
    answers = tuple(("r", i, s) for i, s in zip(indices, scores))
    invokes = tuple(v if isinstance(v, tuple) else (size, v) for v in invoke)
    return ReleaseWindow(answers, invokes, len(answers))


def probe(ratio: float, pairs: int = canary_probe.PAIRS) -> canary_probe.Probe:
    return canary_probe.Probe(ratio, pairs, 10.0 * ratio, 10.0)


class Timed:
    """A model whose invokes report set CPU times, in turn; it keeps the inputs it was given."""

    def __init__(self, seconds, shape=(1, 4), dtype=np.int8):
        self.input = type("Spec", (), {"shape": shape, "dtype": np.dtype(dtype)})()
        self.seconds, self.given = list(seconds), []

    def cpu_invoke(self, q):
        self.given.append(q)
        return self.seconds[(len(self.given) - 1) % len(self.seconds)]


def classes(n, shares, seed=0):
    rng = np.random.default_rng(seed)
    return [int(v) for v in rng.choice(len(shares), size=n, p=shares)]


def test_the_same_answers_pass_once_long_enough():
    before = window(classes(500, [0.5, 0.3, 0.2], 1))
    after = window(classes(400, [0.5, 0.3, 0.2], 2))
    assert canary.judge(CONFIG, after, before, 0, 5.0, ROUTES, probe(1.1)).outcome == canary.WAIT
    verdict = canary.judge(CONFIG, after, before, 0, 10.0, ROUTES, probe(1.1))
    assert verdict.outcome == canary.PASS and verdict.figures["not_judged"] == []
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


def test_a_slower_release_fails_on_its_cpu_time_per_sample_at_once():
    verdict = canary.judge(CONFIG, window([0] * 10), window([0] * 10), 0, 0.1, ROUTES, probe(3.0))
    assert verdict.outcome == canary.FAIL and verdict.reason.startswith(
        "CPU time per sample is 3.00x the previous release's (30.0 us against 10.0, 200 invokes of each in turn")
    assert verdict.figures["latency_invokes"] == 200


def test_the_probe_takes_turns_and_compares_a_low_quantile_per_sample():
    """The previous release 10 us an invoke, one in ten at 50 (an interrupt); the new one 30 us at
    a batch of 2 (15 a sample)."""
    previous, new = Timed([50e-6] + [10e-6] * 9), Timed([30e-6], shape=(2, 4), dtype=np.float32)
    order = []
    previous.cpu_invoke = lambda q, f=previous.cpu_invoke: order.append("p") or f(q)
    new.cpu_invoke = lambda q, f=new.cpu_invoke: order.append("n") or f(q)
    result = canary_probe.paired(previous, new, pairs=100)
    assert result.pairs == 100 and result.ratio == pytest.approx(1.5)
    assert (result.previous_us, result.new_us) == (pytest.approx(10.0), pytest.approx(15.0))
    assert order[:6] == ["p", "n", "n", "p", "p", "n"]  # the order swapped each pair
    assert previous.given[0].shape == (1, 4) and previous.given[0].dtype == np.int8 and not previous.given[0].any()
    assert new.given[0].shape == (2, 4) and new.given[0].dtype == np.float32


def test_the_probe_stops_at_its_budget_and_judges_nothing_below_its_minimum():
    ticks = iter(range(1000))
    result = canary_probe.paired(Timed([1e-3]), Timed([1e-3]), budget_s=1.5, clock=lambda: next(ticks))
    assert result.pairs == 2 and result.ratio is None
    assert result.note == f"2 pairs of invokes in 1.5 s, fewer than {canary_probe.MIN_PAIRS}"
    verdict = canary.judge(CONFIG, window([0] * 10), window([0] * 10), 0, 10.0, ROUTES, result)
    assert verdict.figures["latency_ratio"] is None
    assert verdict.figures["not_judged"][0] == "latency: " + result.note


def test_a_model_that_cannot_be_loaded_leaves_the_latency_unjudged_and_says_why():
    def fails():
        raise ValueError("no such file")

    result = canary_probe.against(canary_probe.copy_of(fails), lambda: Timed([1e-5]))
    assert result.ratio is None and result.note == "the model could not be loaded for the probe: no such file"
    assert canary_probe.against(Timed([1e-5]), fails).note.endswith("no such file")


def test_the_live_invokes_are_shown_per_batch_size_and_not_judged():
    """A busy node's previous window: mostly batches of 8 (5 us a sample), some of 1 (12 us); the
    new release on a quiet node: batches of 1 at 12.5 us. Pooled, the median would read 2.5x."""
    before = window([0] * 10, invoke=[(8, 5e-6)] * 300 + [(1, 12e-6)] * 150)
    after = window([0] * 10, invoke=[(1, 12.5e-6)] * 150)
    verdict = canary.judge(CONFIG, after, before, 0, 1.0, ROUTES, probe(1.0))
    assert verdict.outcome == canary.WAIT
    assert verdict.figures["live_latency_ratio"] == pytest.approx(12.5 / 12, abs=1e-3)
    slower = window([0] * 10, invoke=[(1, 9e-5)] * 150)
    assert canary.judge(CONFIG, slower, before, 0, 1.0, ROUTES, probe(1.0)).outcome == canary.WAIT  # shown only


def test_a_batch_size_run_too_few_times_is_left_out_of_the_live_ratio():
    few = canary_cpu.BUCKET_MIN_INVOKES - 1
    before = window([0] * 10, invoke=[(1, 1e-5)] * 100 + [(8, 1e-6)] * few)
    after = window([0] * 10, invoke=[(1, 1e-5)] * 100 + [(8, 9e-6)] * few)  # 9x, but in too few invokes
    verdict = canary.judge(CONFIG, after, before, 0, 1.0, ROUTES, probe(1.0))
    assert verdict.figures["live_latency_ratio"] == 1.0


def test_short_of_the_minimums_a_canary_passes_and_says_what_it_did_not_judge():
    config = CanaryConfig(duration_s=10, min_answers=30)
    before = window(classes(500, [0.5, 0.5], 1))
    verdict = canary.judge(config, window([2] * 30), before, 0, 10.0, ROUTES, probe(1.0))
    assert verdict.outcome == canary.PASS
    assert verdict.figures["latency_ratio"] == 1.0 and verdict.figures["psi"] is None
    assert verdict.figures["not_judged"] == [
        f"PSI of route 'r': 30 of {canary.PSI_MIN_ANSWERS} answers (new release 30, previous 500)"]
    assert verdict.reason == "30 answers in 10 s; not judged: " + "; ".join(verdict.figures["not_judged"])


def test_anomaly_scores_are_compared_in_the_previous_deciles():
    rng = np.random.default_rng(3)
    before = window([None] * 500, list(rng.normal(1.0, 0.1, 500)))
    same = window([None] * 400, list(rng.normal(1.0, 0.1, 400)))
    shifted = window([None] * 400, list(rng.normal(1.5, 0.1, 400)))
    assert canary.judge(CONFIG, same, before, 0, 10.0, ROUTES).outcome == canary.PASS
    assert canary.judge(CONFIG, shifted, before, 0, 1.0, ROUTES).outcome == canary.FAIL


def test_a_resumed_canary_judges_only_the_internal_rate_and_says_so():
    verdict = canary.judge(CONFIG, window([1] * 400, invoke=[1.0] * 400), window(), 0, 10.0, ROUTES)
    assert verdict.outcome == canary.PASS and verdict.figures["psi"] is None and verdict.figures["latency_ratio"] is None
    assert "not judged: latency: no copy of the previous release to invoke beside the new one" in verdict.reason


def test_the_watch_credits_each_release_and_forgets_on_request():
    watch = ModelWatch()
    watch.observe([("aaa", "r", 1, 0.9), ("bbb", "r", 0, 0.8), ("aaa", "r", 2, 0.7)])
    watch.invoked("aaa", [(4, 0.004), (1, 0.002)])
    assert watch.window("aaa").seen == 2 and watch.window("aaa").invokes == ((4, 0.001), (1, 0.002))
    assert watch.window("bbb").answers == (("r", 0, 0.8),)
    watch.forget("aaa")
    assert watch.window("aaa").seen == 0
