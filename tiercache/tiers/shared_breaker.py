"""The shared tier's circuit breaker: a failed store is left alone for a while, longer after each failure.

A node that is down, a network that is too slow (a command past its timeout) or a cluster that went away
turns the tier off: while it is off, every call answers at once as the store being empty (a miss, a
refused reservation) instead of waiting on the network, so that loads from the local tiers carry on and no
engine waits on a dead cluster. After the backoff the next call tries the store again; a success turns the
tier back on and resets the backoff, a failure doubles it (up to the maximum). Every failure is counted.

Thread-safe.

Primitives:
    Breaker: available, failed, succeeded, errors, open_until.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)


class Breaker:
    """On/off state of one remote store, with exponential backoff and an error count."""

    def __init__(
        self,
        label: str,
        initial_s: float,
        max_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Args: label: the store in log lines; initial_s / max_s: first and longest time off; clock: seconds."""
        self._label = label
        self._initial = initial_s
        self._max = max_s
        self._clock = clock
        self._lock = threading.Lock()
        self._backoff = initial_s
        self._open_until = float("-inf")
        self._errors = 0
        self._down = False

    @property
    def errors(self) -> int:
        """Failed calls to the store since start."""
        with self._lock:
            return self._errors

    @property
    def open_until(self) -> float:
        """Clock time before which the store is left alone (``-inf`` when it is on)."""
        with self._lock:
            return self._open_until

    def available(self) -> bool:
        """Whether a call may go to the store now (on, or its time off is over: a retry)."""
        with self._lock:
            return self._clock() >= self._open_until

    def failed(self, reason: str) -> None:
        """Count a failed call and turn the store off for the current backoff, then double the backoff."""
        with self._lock:
            self._errors += 1
            off = self._backoff
            self._open_until = self._clock() + off
            self._backoff = min(self._backoff * 2, self._max)
            first = not self._down
            self._down = True
        if first:
            logger.warning("%s is unavailable (%s): off for %.2f s, then retried", self._label, reason, off)
        else:
            logger.info("%s still unavailable (%s): off for %.2f s", self._label, reason, off)

    def counted(self, reason: str) -> None:
        """Count a failed call that says nothing about the store being reachable (e.g. out of memory)."""
        with self._lock:
            self._errors += 1
        logger.info("%s refused a call: %s", self._label, reason)

    def succeeded(self) -> None:
        """A call went through: the store is on, the backoff starts over."""
        with self._lock:
            if not self._down:
                return
            self._down = False
            self._backoff = self._initial
            self._open_until = float("-inf")
        logger.warning("%s is available again", self._label)
