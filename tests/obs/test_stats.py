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


def test_http_requests_are_counted_by_route_and_status_for_the_stats_and_prometheus():
    from daemon.obs.prometheus import StatsCollector

    stats = Stats()
    for route, status in (("a", 200), ("a", 200), ("a", 503), ("", 404)):
        stats.count_http(route, status)
    assert stats.http_counts() == {"": {"404": 1}, "a": {"200": 2, "503": 1}}
    family = next(f for f in StatsCollector(stats, dict).collect() if f.name == "edge_inferd_http_requests")
    assert {(s.labels["route"], s.labels["code"]): s.value for s in family.samples
            if s.name.endswith("_total")} == {("", "404"): 1, ("a", "200"): 2, ("a", "503"): 1}
