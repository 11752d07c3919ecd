"""Several rounds of `bench e2e` as one result: the median of every number, each round kept.

A round runs every selected phase, its consumers one after the other, so three rounds
measure A B C, A B C, A B C: a slow minute of a shared machine lands on one round of each
consumer, not on all of one. Ratios are then read off the medians (report.py), and each
round's own ratios are listed beside them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_DECIMALS = 3


def merge(rounds: list[dict]) -> dict:
    """One round as it is; more: medians, by the same keys and list positions, plus "rounds"."""
    if len(rounds) == 1:
        return rounds[0]
    merged = _median(rounds)
    merged["rounds"] = rounds
    return merged


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _median(values: list) -> Any:
    """Dicts key by key, equal-length lists item by item, numbers (None aside) by their median;
    anything else (text, lists of unequal length) as the first round had it."""
    first = values[0]
    if isinstance(first, dict):
        keys = dict.fromkeys(k for v in values if isinstance(v, dict) for k in v)
        return {k: _median([v[k] for v in values if isinstance(v, dict) and k in v]) for k in keys}
    if isinstance(first, list) and all(isinstance(v, list) and len(v) == len(first) for v in values):
        return [_median(list(items)) for items in zip(*values)]
    numbers = [v for v in values if _is_number(v)]
    if numbers and all(v is None or _is_number(v) for v in values):
        middle = float(np.median(numbers))
        return int(middle) if all(isinstance(v, int) for v in numbers) and middle.is_integer() else \
            round(middle, _DECIMALS)
    return first
