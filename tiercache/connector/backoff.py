"""Reconnect backoff: after a failed attempt, calls fail at once (no network) until the next attempt is due.

A daemon that is down then costs an engine about one fast failed attempt per backoff period, never a hang.

Primitives:
    BackoffConfig: initial delay, growth factor and ceiling.
    Backoff: ``remaining_s`` (0 when an attempt may go out), ``failed``, ``succeeded``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from tiercache.errors import InvalidArgumentError


@dataclass(frozen=True, slots=True)
class BackoffConfig:
    """Exponential backoff between connection attempts.

    Attributes:
        initial_s: delay after the first failure.
        factor: growth per further failure.
        max_s: ceiling of the delay.
    """

    initial_s: float = 0.05
    factor: float = 2.0
    max_s: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.initial_s <= self.max_s:
            raise InvalidArgumentError(
                "initial_s", f"need 0 < initial_s <= max_s, got {self.initial_s!r} and {self.max_s!r}"
            )
        if not self.factor >= 1:
            raise InvalidArgumentError("factor", f"must be >= 1, got {self.factor!r}")


class Backoff:
    """Backoff state of one connection. Not thread-safe: the owner guards it with its lock."""

    def __init__(self, config: BackoffConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self._config = config
        self._clock = clock
        self._delay = 0.0
        self._next_attempt = 0.0
        self.failures = 0

    def remaining_s(self) -> float:
        """Seconds until the next attempt may go out (0: now)."""
        return max(0.0, self._next_attempt - self._clock())

    def failed(self) -> float:
        """Record a failed attempt; returns the delay before the next one."""
        cfg = self._config
        self._delay = cfg.initial_s if self._delay == 0 else min(cfg.max_s, self._delay * cfg.factor)
        self._next_attempt = self._clock() + self._delay
        self.failures += 1
        return self._delay

    def succeeded(self) -> None:
        """Record a successful call: the next failure starts from the initial delay again."""
        self._delay = 0.0
        self._next_attempt = 0.0
        self.failures = 0
