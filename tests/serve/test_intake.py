"""Intake takes a read burst at once: every message routed, rated and admitted (or answered),
then one hand-off of the admitted jobs to the pool; a message that raises costs only itself."""

from __future__ import annotations

from daemon.obs.stats import Stats
from daemon.serve.intake import Intake
from tests.fakes import FakeClock
from tests.serve.test_rate import _codes, _serving
from tests.serve.test_serving import Recorder, _inbound, _request


class _Hand:
    """The pool's `submit_many`, recorded: each call is one hand-off."""

    def __init__(self, accepting: bool = True):
        self.calls: list[list] = []
        self.accepting = accepting

    def __call__(self, jobs) -> bool:
        self.calls.append(list(jobs))
        return self.accepting


class _Unsized(bytes):
    def __len__(self) -> int:
        raise RuntimeError("a payload that breaks intake")


def _intake(d, hand: _Hand, clock: FakeClock) -> Intake:
    return Intake(d.routes, d.rate, d.admission, hand, d.replier, d.intake._stats, clock=clock)


def test_a_burst_is_handed_on_in_one_call_with_its_refusals_answered_at_once():
    clock, stats, rec, hand = FakeClock(100.0), Stats(), Recorder(), _Hand()
    d = _serving(clock, stats, min_interval_ms=1000)
    d.attach(rec)
    burst = [_inbound("sensors/a/imu", _request(0), 1), _inbound("nobody/here", b"x", 2),
             _inbound("sensors/a/imu", _request(1), 3),  # the same device again: rate_limited
             _inbound("sensors/b/imu", _request(2), 4), _inbound("sensors/c/imu", _request(3), 5)]
    _intake(d, hand, clock).on_burst(burst)
    assert [[job.inbound.mid for job in call] for call in hand.calls] == [[1, 4, 5]]
    assert _codes(rec) == [(1, "rate_limited")] and rec.acked == [2, 3]
    assert stats.count("received") == 5 and stats.count("unroutable") == 1 and stats.count("errors.rate_limited") == 1


def test_a_message_that_raises_costs_only_itself_and_the_rest_are_served():
    clock, stats, rec = FakeClock(100.0), Stats(), Recorder()
    d = _serving(clock, stats)
    d.attach(rec)
    broken = _inbound("sensors/a/imu", _Unsized(), 2)  # its length raises in admission
    d.intake.on_burst([_inbound("sensors/a/imu", _request(0), 1), broken, _inbound("sensors/a/imu", _request(2), 3)])
    assert d.pool.depth == 2
    d.start()
    rec.wait(2)
    assert d.stop(30)
    assert _codes(rec) == [(0, "result"), (2, "result")] and rec.acked == [1, 3]


def test_a_burst_that_arrives_while_the_workers_stop_gives_back_its_budget_and_stays_unacked():
    clock, stats, rec, hand = FakeClock(100.0), Stats(), Recorder(), _Hand(accepting=False)
    d = _serving(clock, stats, coalesce="latest")
    d.attach(rec)
    _intake(d, hand, clock).on_burst([_inbound("sensors/a/imu", _request(i), i + 1) for i in range(3)])
    assert len(hand.calls) == 1 and rec.published == [] and rec.acked == []
    assert d.admission.queued_bytes == 0
    # Withdrawn, the newest (never queued) supersedes none of the older ones.
    assert not d.rate.superseded("sensors/a/imu", hand.calls[0][0].seq)
