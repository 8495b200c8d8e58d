"""Single flight: concurrent callers of the same key share one execution of a function.

The first caller of a key runs the function; callers that arrive while it runs wait for its result (or its
exception) instead of running it again. Nothing is cached after the call ends.

Primitives:
    SingleFlight: ``run(key, fn) -> (result, joined)``; ``joins`` counts callers that shared a flight.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Generic, TypeVar

T = TypeVar("T")


class SingleFlight(Generic[T]):
    """Deduplicates concurrent calls by key. Thread-safe."""

    def __init__(self) -> None:
        """Create an empty flight table."""
        self._lock = threading.Lock()
        self._flights: dict[Hashable, Future[T]] = {}
        self.joins = 0

    def run(self, key: Hashable, fn: Callable[[], T]) -> tuple[T, bool]:
        """Run ``fn`` once for all concurrent callers of ``key``.

        Returns:
            ``(result, joined)``: ``joined`` is True when this caller waited for another caller's run
            (and so shares its result object).

        Raises:
            Whatever ``fn`` raised, in every caller that shared the flight.
        """
        with self._lock:
            flight = self._flights.get(key)
            leader = flight is None
            if flight is None:
                flight = self._flights[key] = Future()
            else:
                self.joins += 1
        if not leader:
            return flight.result(), True
        try:
            result = fn()
        except BaseException as exc:
            flight.set_exception(exc)
            raise
        finally:
            with self._lock:
                del self._flights[key]
        flight.set_result(result)
        return result, False
