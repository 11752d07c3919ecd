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


def test_counters_from_many_threads_are_summed_when_read_and_outlive_their_threads():
    import threading

    stats = Stats()
    stats.record({"received": 5})  # a batch's counts, under the lock, beside the threads' own
    start = threading.Barrier(4)

    def count(n: int) -> None:
        start.wait()
        for _ in range(n):
            stats.incr("received")
        stats.incr("devices", -1)

    threads = [threading.Thread(target=count, args=(1000 * (i + 1),)) for i in range(3)]
    for thread in threads:
        thread.start()
    start.wait()
    while any(t.is_alive() for t in threads):  # reading while they count never fails
        assert 5 <= stats.count("received") <= 6005
    for thread in threads:
        thread.join()
    stats.incr("devices", 4)
    assert stats.count("received") == 6005 and stats.snapshot()["counts"]["devices"] == 1
