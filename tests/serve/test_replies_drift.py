"""The reply path feeds drift (daemon/serve/replies.py -> daemon/obs/drift.py): results of classify and
anomaly routes count, errors and detector or `values` replies do not, once per batch."""

from __future__ import annotations


from daemon.config.drift import DriftConfig
from daemon.obs.drift import DriftMonitor, Reference, RouteSpec
from daemon.obs.stats import Stats
from daemon.serve.replies import Replier, Tally
from daemon.transport.inbound import Inbound

LABELS = ("a", "b")


def _monitor() -> DriftMonitor:
    config = DriftConfig(window=100, min_answers=1)
    monitor = DriftMonitor(config)
    monitor.configure(config, [RouteSpec("cls", "classify", LABELS, ()), RouteSpec("ae", "anomaly", (), ()),
                               RouteSpec("cam", "detect", (), ())],
                      {"cls": Reference.of("classify", [0.9, 0.9], [0, 1], 2),
                       "ae": Reference.of("anomaly", [0.01 * i for i in range(1, 101)])})
    return monitor


def _result(route: str, **fields) -> dict:
    return {"id": 1, "route": route, "model": "m", "model_sha256": "0" * 12, **fields, "cached": False,
            "latency_ms": 1.0}


def test_results_of_measured_kinds_reach_the_window_once_recorded():
    monitor = _monitor()
    replier = Replier(Stats(), monitor)
    inbound = Inbound("t/1", b"{}", 1, 1, 0.0)
    tally = Tally()
    replier.send(inbound, "out", _result("cls", label="b", index=1, score=0.8, top_k=[]), tally)
    replier.send(inbound, "out", _result("ae", anomaly_score=0.5), tally)
    replier.send(inbound, "out", _result("cam", detections=[]), tally)
    replier.send(inbound, "out", {"id": 2, "route": "cls", "error": {"code": "bad_payload", "message": "x"}},
                 tally)
    assert monitor.snapshot()["cls"]["answers"] == 0  # nothing before the batch is recorded
    replier.record(tally)
    state = monitor.snapshot()
    assert state["cls"]["answers"] == 1 and state["cls"]["label_shares"] == {"b": 1.0}
    assert state["ae"]["answers"] == 1 and "cam" not in state

