"""Test doubles shared by the unit tests."""

from __future__ import annotations


class FakeClock:
    """A clock set by hand: calling it returns `now`, which a test assigns or advances."""

    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now
