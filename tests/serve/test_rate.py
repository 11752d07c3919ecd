"""Per-device rate control (daemon/serve/rate.py) through intake and the worker side, on a fake clock.

`min_interval_ms` answers `rate_limited` at admission; `coalesce: latest` answers the
superseded jobs `superseded` when a worker takes them and serves each device's newest.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from daemon.config.loader import load_config
from daemon.serve import wiring
from daemon.pipeline.route_pipeline import route_pipeline
from daemon.serve.rate import DEVICES, EVICTED, DeviceRate
from daemon.model.runtime import Model
from daemon.obs.stats import Stats
from tests.fakes import FakeClock
from tests.serve.test_serving import ONE_WORKER, ROOT, Recorder, _inbound, _request


def _serving(clock: FakeClock, stats: Stats, workers=ONE_WORKER, **route_keys) -> wiring.Serving:
    config = load_config(ROOT / "config.yaml")
    route = replace(config.routes[0], **route_keys)
    model = Model(config.models["activity"].path, max_batch=8)
    pipe = route_pipeline(config, route, model)
    return wiring.build([pipe], None, stats, workers, lambda i: {"activity": model}, clock=clock)


def _codes(rec: Recorder) -> list:
    return [(r["id"], r.get("error", {}).get("code", "result")) for _, r, _ in rec.published]


def test_min_interval_answers_rate_limited_at_once_and_admits_after_it():
    clock, stats, rec = FakeClock(100.0), Stats(), Recorder()
    d = _serving(clock, stats, min_interval_ms=500)
    d.attach(rec)  # never started: an admitted request stays queued, only refusals are answered
    d.intake.on_message(_inbound("sensors/d1/imu", _request(0), 1))
    clock.now += 0.499
    d.intake.on_message(_inbound("sensors/d1/imu", b'{"id": 1, "data": [not json', 2))  # answered unparsed
    assert _codes(rec) == [(1, "rate_limited")] and rec.acked == [2] and d.pool.depth == 1
    assert "min_interval_ms" in rec.published[0][1]["error"]["message"]
    clock.now += 0.001  # 500 ms after the admitted one (not after the refused one)
    d.intake.on_message(_inbound("sensors/d1/imu", _request(2), 3))
    assert d.pool.depth == 2 and len(rec.published) == 1
    assert stats.count("errors.rate_limited") == 1


def test_min_interval_is_per_device():
    clock, stats, rec = FakeClock(100.0), Stats(), Recorder()
    d = _serving(clock, stats, min_interval_ms=1000)
    d.attach(rec)
    for i, device in enumerate(("a", "b", "c", "a", "b")):
        d.intake.on_message(_inbound(f"sensors/{device}/imu", _request(i), i))
    assert _codes(rec) == [(3, "rate_limited"), (4, "rate_limited")]
    assert d.pool.depth == 3 and stats.count(DEVICES) == 3


def test_without_the_keys_nothing_is_limited_or_tracked():
    clock, stats, rec = FakeClock(100.0), Stats(), Recorder()
    d = _serving(clock, stats)
    d.attach(rec)
    for i in range(4):
        d.intake.on_message(_inbound("sensors/a/imu", _request(i), i))
    assert rec.published == [] and d.pool.depth == 4 and len(d.rate) == 0


def test_coalescing_answers_each_superseded_request_once_and_serves_the_newest():
    clock, stats, rec = FakeClock(100.0), Stats(), Recorder()
    d = _serving(clock, stats, coalesce="latest")
    d.attach(rec)
    order = [("a", 0), ("b", 1), ("a", 2), ("a", 3), ("b", 4), ("c", 5)]
    for device, i in order:  # queued before the worker starts: one batch
        d.intake.on_message(_inbound(f"sensors/{device}/imu", _request(i), 10 + i))
    d.start()
    rec.wait(len(order))
    assert d.stop(30)
    codes = dict(_codes(rec))
    assert len(rec.published) == len(order) and sorted(codes) == [i for _, i in order]
    assert codes == {0: "superseded", 1: "superseded", 2: "superseded", 3: "result", 4: "result", 5: "result"}
    assert sorted(rec.acked) == [10 + i for _, i in order]  # each acked once, after its reply
    assert stats.count("errors.superseded") == 3 and stats.count("results") == 3
    assert d.admission.queued_bytes == 0  # the superseded ones gave their budget back


def test_a_job_taken_before_a_newer_one_arrives_is_served():
    rate = DeviceRate(Stats())
    first = rate.admitted("d", 0.0, coalesce=True)
    assert not rate.superseded("d", first)  # the newest when a worker takes it
    second = rate.admitted("d", 0.1, coalesce=True)
    assert rate.superseded("d", first) and not rate.superseded("d", second)
    rate.withdraw("d", second)  # never queued: it supersedes nothing
    assert not rate.superseded("d", first)


def test_the_device_state_is_bounded_and_a_forgotten_device_is_served():
    stats = Stats()
    rate = DeviceRate(stats, max_devices=2)
    old = rate.admitted("a", 0.0, coalesce=True)
    rate.admitted("a", 0.0, coalesce=True)
    rate.admitted("b", 0.0, coalesce=True)
    rate.admitted("c", 0.0, coalesce=True)  # pushes out "a", the least recently admitted
    assert len(rate) == 2 and stats.count(DEVICES) == 2 and stats.count(EVICTED) == 1
    assert not rate.superseded("a", old) and not rate.too_soon("a", 1000, 0.0)
    assert Counter(stats.snapshot()["counts"])[EVICTED] == 1
