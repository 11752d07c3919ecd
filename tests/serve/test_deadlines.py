"""Deadlines decide shedding (issue 17): through intake on a fake clock, with a real pipeline.

- no deadline: queued however long the predicted wait, while the byte budget holds;
- `workers.max_wait_ms`, when an operator sets it: past it, `overloaded` at once;
- a v5 message expiry that the predicted wait passes: `expired` at admission;
- one that even the request's own measured service time passes, with nothing queued: the same;
- a v5 message expiry already run out when the request is read: `expired`, and counted.
"""

from __future__ import annotations

from daemon.config.schema import WorkersConfig
from daemon.obs.stats import Stats
from daemon.serve.intake import EXPIRED_ON_ARRIVAL
from tests.fakes import FakeClock
from tests.serve.test_rate import _codes, _serving
from tests.serve.test_serving import Recorder, _inbound, _request

ROUTE = "activity"
# What the admission's cost fit learns before each test: 10 s per request, so a queue of a
# few requests predicts a wait of tens of seconds.
SLOW_S = 10.0


def _slow_serving(clock: FakeClock, stats: Stats, workers: WorkersConfig = WorkersConfig(max=1)):
    d = _serving(clock, stats, workers=workers)
    d.admission.observe(ROUTE, 1, SLOW_S)
    rec = Recorder()
    d.attach(rec)  # never started: admitted requests stay queued, only refusals are answered
    return d, rec


def test_without_a_deadline_a_long_predicted_wait_is_queued_not_shed():
    clock, stats = FakeClock(100.0), Stats()
    d, rec = _slow_serving(clock, stats)  # the default: no max_wait_ms
    for i in range(6):
        d.intake.on_message(_inbound("sensors/d1/imu", _request(i), i + 1, received_at=clock.now))
    assert rec.published == [] and d.pool.depth == 6
    assert d.admission.predicted_wait_s() == 6 * SLOW_S  # a minute of work ahead, and nothing shed


def test_max_wait_ms_when_set_caps_every_request_wait():
    clock, stats = FakeClock(100.0), Stats()
    d, rec = _slow_serving(clock, stats, WorkersConfig(max=1, max_wait_ms=15_000))
    for i in range(4):
        d.intake.on_message(_inbound("sensors/d1/imu", _request(i), i + 1, received_at=clock.now))
    assert _codes(rec) == [(2, "overloaded"), (3, "overloaded")]  # 20 s ahead of them > 15 s
    assert "workers.max_wait_ms" in rec.published[0][1]["error"]["message"] and d.pool.depth == 2


def test_a_deadline_the_predicted_wait_passes_is_expired_at_admission():
    clock, stats = FakeClock(100.0), Stats()
    d, rec = _slow_serving(clock, stats)
    d.intake.on_message(_inbound("sensors/d1/imu", _request(0), 1, received_at=clock.now))
    d.intake.on_message(_inbound("sensors/d1/imu", _request(1), 2, received_at=clock.now, expiry_s=5))
    d.intake.on_message(_inbound("sensors/d1/imu", _request(2), 3, received_at=clock.now, expiry_s=60))
    assert _codes(rec) == [(1, "expired")] and rec.acked == [2]  # 10 s ahead of it, 5 s left
    assert "predicted wait" in rec.published[0][1]["error"]["message"]
    assert d.pool.depth == 2 and stats.count(EXPIRED_ON_ARRIVAL) == 0


def test_an_expiry_run_out_before_the_request_is_read_is_answered_expired_and_counted():
    clock, stats = FakeClock(100.0), Stats()
    d, rec = _slow_serving(clock, stats)
    d.intake.on_message(_inbound("sensors/d1/imu", _request(0), 1, received_at=97.0, expiry_s=3))  # ran out now
    d.intake.on_message(_inbound("sensors/d1/imu", _request(1), 2, received_at=97.0, expiry_s=14))  # 11 s left
    assert _codes(rec) == [(0, "expired")] and rec.acked == [1] and d.pool.depth == 1
    assert "before it was read" in rec.published[0][1]["error"]["message"]
    assert stats.count(EXPIRED_ON_ARRIVAL) == 1 and stats.count("errors.expired") == 1
    assert stats.count("received") == 2


def test_a_deadline_its_own_service_time_passes_is_expired_at_admission_with_nothing_queued():
    clock, stats = FakeClock(100.0), Stats()
    d, rec = _slow_serving(clock, stats)  # a request takes 10 s to serve
    d.intake.on_message(_inbound("sensors/d1/imu", _request(0), 1, received_at=clock.now, expiry_s=5))
    d.intake.on_message(_inbound("sensors/d1/imu", _request(1), 2, received_at=clock.now, expiry_s=11))
    assert _codes(rec) == [(0, "expired")] and d.pool.depth == 1  # 5 s left, 10 s of work: never in time
    assert "its own 10000.0 ms" in rec.published[0][1]["error"]["message"]

