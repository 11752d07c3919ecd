"""Admission by memory and predicted latency, driven by a fake clock (no sleeps, no timing)."""

from __future__ import annotations

import pytest

from daemon.serve.admission import JOB_OVERHEAD_BYTES, Admission, CostModel, Refusal, Ticket
from tests.fakes import FakeClock


def test_cost_model_fits_batch_time_as_a_line():
    model = CostModel()
    for n in (1, 4, 8, 16, 32, 1, 32):
        model.observe(n, 0.002 * n + 0.010)  # 2 ms per request + 10 ms per batch
    assert model.a == pytest.approx(0.002) and model.b == pytest.approx(0.010)
    assert model.per_request(10) == pytest.approx(0.003)


def test_cost_model_with_one_batch_size_uses_time_per_request():
    model = CostModel()
    model.observe(4, 0.008)
    model.observe(4, 0.008)
    assert (model.a, model.b) == (pytest.approx(0.002), 0.0)


def test_overloaded_only_when_the_predicted_wait_would_exceed_the_budget():
    clock = FakeClock(100.0)
    admission = Admission(budget_bytes=1 << 30, max_wait_s=0.102, workers=2, batch_size=1, clock=clock)
    first = admission.admit("r", 100)
    assert isinstance(first, Ticket) and first.cost_s == 0.0  # unmeasured: only memory bounds it
    admission.release(first)
    admission.observe("r", 1, 0.010)  # 10 ms per request, 2 workers: 5 ms of wait per queued request
    tickets = [admission.admit("r", 100) for _ in range(21)]
    assert all(isinstance(t, Ticket) for t in tickets)  # 21 queued: the last one saw 20 x 5 = 100 ms
    refused = admission.admit("r", 100)
    assert isinstance(refused, Refusal) and refused.code == "overloaded"
    assert "predicted wait 105 ms exceeds workers.max_wait_ms 102" in refused.message
    admission.release(tickets.pop())
    assert isinstance(admission.admit("r", 100), Ticket)  # room again once a worker took one


def test_the_memory_budget_counts_bytes_not_messages():
    budget = 10 * (1000 + JOB_OVERHEAD_BYTES)
    admission = Admission(budget_bytes=budget, max_wait_s=10.0, workers=1, batch_size=1, clock=FakeClock(100.0))
    small = [admission.admit("r", 10) for _ in range(10)]
    big = [admission.admit("r", 1000) for _ in range(10)]
    assert all(isinstance(t, Ticket) for t in small)
    assert sum(isinstance(t, Ticket) for t in big) == 6  # (15,120 - 10 x 522) // 1,512 bytes
    refused = next(t for t in big if isinstance(t, Refusal))
    assert refused.code == "overloaded" and "workers.queue_mb" in refused.message
    for ticket in small + big:
        if isinstance(ticket, Ticket):
            admission.release(ticket)
    assert admission.queued_bytes == 0 and admission.queued_work_s == 0.0


def test_a_deadline_that_the_predicted_wait_passes_is_expired_at_once():
    clock = FakeClock(now=100.0)
    admission = Admission(budget_bytes=1 << 30, max_wait_s=10.0, workers=1, batch_size=1, clock=clock)
    admission.observe("r", 1, 0.050)
    held = [admission.admit("r", 10) for _ in range(4)]  # 200 ms of work queued
    assert isinstance(admission.admit("r", 10, deadline=100.5), Ticket)  # 200 ms < 500 ms left
    late = admission.admit("r", 10, deadline=100.2)  # 250 ms queued ahead, 200 ms left
    assert isinstance(late, Refusal) and late.code == "expired"
    assert len(held) == 4


def test_costs_are_per_route_and_read_at_a_full_batch():
    admission = Admission(budget_bytes=1 << 30, max_wait_s=10.0, workers=1, batch_size=32, clock=FakeClock(100.0))
    for n in (1, 32):
        admission.observe("heavy", n, 0.001 * n + 0.032)
        admission.observe("light", n, 0.0001 * n)
    assert admission.cost_per_request_s("heavy") == pytest.approx(0.002)  # 1 ms + 32 ms / 32
    assert admission.cost_per_request_s("light") == pytest.approx(0.0001)
    assert admission.cost_per_request_s("unseen") == 0.0


def test_holding_queues_a_broker_held_request_past_the_budget_and_stops_reading_until_below_resume():
    per = 1000 + JOB_OVERHEAD_BYTES
    admission = Admission(budget_bytes=4 * per, max_wait_s=None, workers=1, batch_size=1, clock=FakeClock(100.0))
    tickets = [admission.admit("r", 1000, held_by_broker=True) for _ in range(4)]
    assert admission.has_room() and admission.holds == 0  # exactly at the budget: still reading
    tickets += [admission.admit("r", 1000, held_by_broker=True) for _ in range(2)]  # the rest of a read burst
    assert all(isinstance(t, Ticket) for t in tickets) and admission.queued_bytes == 6 * per
    assert not admission.has_room() and admission.holds == 1
    qos0 = admission.admit("r", 1000)  # a QoS 0 request: no broker keeps it, so it is still answered
    assert isinstance(qos0, Refusal) and qos0.code == "overloaded" and "workers.queue_mb" in qos0.message
    for ticket in tickets[:2]:  # 4 left: above 0.75 x the budget of 4
        admission.release(ticket)
    assert not admission.has_room()
    admission.release(tickets[2])  # 3 left: at most 0.75 x the budget, reading resumes
    assert admission.has_room() and admission.holds == 1
