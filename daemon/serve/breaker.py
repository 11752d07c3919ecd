"""A circuit breaker for a far tier: stop calling a server that keeps failing, for a while.

Closed: every call goes. `failures` failed calls in a row open it for `open_s`: no call goes,
and the caller answers locally at once. Past `open_s` one trial call goes (half-open): its
success closes the breaker, its failure opens it again. An episode (from the first failure
that opens it to the success that closes it) logs one line when it opens and one when it ends,
however many calls fail in between.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

logger = logging.getLogger(__name__)


class Breaker:
    def __init__(self, name: str, failures: int, open_s: float, clock: Callable[[], float]):
        self._name = name
        self._limit = failures
        self._open_s = open_s
        self._clock = clock
        self._lock = threading.Lock()
        self._failed = 0  # in a row
        self._until = None  # open until then (clock); None: closed
        self._trial = False  # a half-open trial call is out
        self._episode_failures = 0
        self.episodes = 0

    def allow(self) -> bool:
        """Whether a call may go now (a True past `open_s` is the one trial call)."""
        with self._lock:
            if self._until is None:
                return True
            if self._trial or self._clock() < self._until:
                return False
            self._trial = True
            return True

    def refusing(self) -> bool:
        """Whether a call now would be refused (unlike `allow`, this takes no trial call)."""
        with self._lock:
            return self._until is not None and (self._trial or self._clock() < self._until)

    @property
    def is_open(self) -> bool:
        with self._lock:
            return self._until is not None

    def failed(self, why: str) -> None:
        with self._lock:
            self._failed += 1
            self._trial = False
            if self._until is not None:
                self._episode_failures += 1
                self._until = self._clock() + self._open_s
                return
            if self._failed < self._limit:
                return
            self._until = self._clock() + self._open_s
            self._episode_failures = self._failed
            self.episodes += 1
        logger.warning("far tier %s failed %d calls in a row (last: %s): local answers for %.0f s, then one "
                       "call tries it again", self._name, self._limit, why, self._open_s)

    def succeeded(self) -> None:
        with self._lock:
            was_open, failures = self._until is not None, self._episode_failures
            self._failed, self._until, self._trial, self._episode_failures = 0, None, False, 0
        if was_open:
            logger.warning("far tier %s answers again (%d calls failed in this episode)", self._name, failures)
