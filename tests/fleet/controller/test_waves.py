"""The wave maths of `fleet rollout` (daemon/fleet/controller/waves.py): cumulative targets, rounded up, at
least one node more each wave, every node exactly once."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from daemon.fleet.controller.waves import WaveError, parse_waves, plan, target


def _nodes(n: int) -> list[str]:
    return [f"gw{i:02d}" for i in range(n)]


def test_the_default_waves_on_three_nodes_move_one_node_at_a_time():
    assert plan(parse_waves("1,10%,50%,100%"), _nodes(3)) == (("gw00",), ("gw01",), ("gw02",))


def test_shares_round_up_exactly():
    assert target("10%", 10) == 1  # not 2 from 1.0000000000000002
    assert target("10%", 11) == 2
    assert plan(parse_waves("10%,50%,100%"), _nodes(20)) == (tuple(_nodes(20)[:2]), tuple(_nodes(20)[2:10]),
                                                             tuple(_nodes(20)[10:]))


def test_a_named_node_goes_next_and_the_rest_follow_in_order():
    assert plan(parse_waves("gw02,100%"), _nodes(3)) == (("gw02",), ("gw00", "gw01"))


def test_specs_after_every_node_add_nothing():
    assert plan(parse_waves("1,100%,100%"), _nodes(2)) == (("gw00",), ("gw01",))


@pytest.mark.parametrize("text", ["", "1,,2", "0", "0%", "150%", "x%"])
def test_bad_specs_are_refused(text):
    with pytest.raises(WaveError):
        parse_waves(text)


def test_a_plan_that_stops_short_of_every_node_is_refused():
    with pytest.raises(WaveError, match="end it with 100%"):
        plan(parse_waves("1,50%"), _nodes(10))


def test_no_node_an_unknown_name_and_a_name_twice_are_refused():
    for specs, nodes in ((["100%"], []), (["gw9", "100%"], _nodes(2)), (["gw00", "gw00", "100%"], _nodes(2))):
        with pytest.raises(WaveError):
            plan(specs, nodes)


_SPEC = st.one_of(st.integers(1, 40).map(str), st.integers(1, 100).map(lambda p: f"{p}%"),
                  st.decimals("0.5", "100", places=1).map(lambda p: f"{p}%"))


@given(st.lists(_SPEC, max_size=6), st.integers(1, 60))
def test_waves_increase_cover_every_node_and_never_assign_twice(specs, n):
    nodes = _nodes(n)
    specs = [*specs, "100%"]
    waves = plan(specs, nodes)
    flat = [node for wave in waves for node in wave]
    assert sorted(flat) == nodes and len(flat) == len(set(flat))  # all, once each
    assert all(wave for wave in waves)  # each wave adds at least one node
    assert flat == nodes  # in the given order
    done = 0
    for spec, wave in zip(specs, waves):
        done += len(wave)
        assert done >= min(target(spec, n), n)  # each target reached (or every node)
