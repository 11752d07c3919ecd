"""Which nodes each wave of a rollout adds (pure; docs/fleet.md, "Rollout record").

A wave spec is a cumulative target: a count (`1`), a share of the nodes (`10%`, rounded up),
or a node's name (that node next, the canary an operator picks). Each wave takes at least one
node more than the last, so a small fleet still moves one step at a time instead of 10% of
three nodes rounding to the same node forever. The plan must reach every node: a rollout that
stops at 50% would leave the record "completed" with half the fleet untouched, so specs that
fall short are refused rather than silently extended.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Sequence

PERCENT = "%"
ALL_PERCENT = 100


class WaveError(ValueError):
    """`--waves` (or its nodes) cannot make a plan; the message is meant for the operator."""


def parse_waves(text: str) -> tuple[str, ...]:
    """`1,10%,50%,100%` as its specs; WaveError on an empty or malformed one."""
    specs = tuple(part.strip() for part in text.split(","))
    if not text.strip() or any(not spec for spec in specs):
        raise WaveError(f"--waves {text!r}: give comma-separated counts, shares or node names, as 1,10%,50%,100%")
    for spec in specs:
        _check_spec(spec)
    return specs


def _check_spec(spec: str) -> None:
    if spec.endswith(PERCENT):
        share = _share(spec)
        if not 0 < share <= ALL_PERCENT:
            raise WaveError(f"--waves: {spec!r} must be above 0% and at most 100%")
    elif spec.isdigit() and int(spec) < 1:
        raise WaveError(f"--waves: {spec!r}: a wave needs at least one node")


def _share(spec: str) -> Fraction:
    try:
        return Fraction(spec[:-1])  # exact: 10% of 10 nodes is 1, not 1.0000000000000002 rounded up to 2
    except ValueError:
        raise WaveError(f"--waves: {spec!r} is not a share such as 10%") from None


def target(spec: str, total: int) -> int:
    """How many nodes a count or share spec asks for in all (not capped; names are not targets)."""
    if spec.endswith(PERCENT):
        return math.ceil(_share(spec) * total / ALL_PERCENT)
    return int(spec)


def plan(specs: Sequence[str], nodes: Sequence[str]) -> tuple[tuple[str, ...], ...]:
    """The nodes each wave adds, in `nodes`' order; every node exactly once, no empty wave.
    Specs left after every node is taken add nothing (`1,100%,100%` is two waves)."""
    if not nodes:
        raise WaveError("no node to roll out to")
    if len(set(nodes)) != len(nodes):
        raise WaveError("a node is listed twice")
    taken: list[str] = []
    waves: list[tuple[str, ...]] = []
    for spec in specs:
        if len(taken) == len(nodes):
            break
        new = _wave(spec, nodes, taken)
        waves.append(new)
        taken += new
    if len(taken) < len(nodes):
        raise WaveError(f"--waves {','.join(specs)} reaches {len(taken)} of {len(nodes)} nodes: "
                        f"end it with 100% (or the node count)")
    return tuple(waves)


def _wave(spec: str, nodes: Sequence[str], taken: list[str]) -> tuple[str, ...]:
    if not spec.endswith(PERCENT) and not spec.isdigit():
        if spec not in nodes:
            raise WaveError(f"--waves names {spec!r}, which is not one of the rollout's nodes")
        if spec in taken:
            raise WaveError(f"--waves names {spec!r} after an earlier wave already took it")
        return (spec,)
    wanted = min(max(target(spec, len(nodes)), len(taken) + 1), len(nodes))
    rest = [node for node in nodes if node not in taken]
    return tuple(rest[: wanted - len(taken)])
