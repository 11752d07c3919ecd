"""Stats: a reply is counted once, by outcome; results and errors are read from the outcomes."""

from __future__ import annotations

from daemon.obs.stats import Stats


def test_results_and_errors_are_summed_from_the_outcomes_by_route():
    stats = Stats()
    stats.record({"received": 4, "inferences": 1}, [2.0],
                 {("a", "result"): 1, ("a", "bad_payload"): 2, ("b", "bad_payload"): 1})
    assert stats.count("results") == 1 and stats.count("errors.bad_payload") == 3
    assert stats.snapshot()["counts"] == {"received": 4, "inferences": 1, "results": 1, "errors.bad_payload": 3}
    assert stats.histograms()["outcomes"][("b", "bad_payload")] == 1
    assert stats.snapshot()["latency_ms"]["n"] == 1
