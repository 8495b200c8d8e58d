"""Single flight: concurrent callers of the same key share one execution of a function.

The first caller of a key runs the function; callers that arrive while it runs wait for its result (or its
exception) instead of running it again. Nothing is cached after the call ends.

A caller that makes many keys' work at once (a batch) leads their flights itself: :meth:`SingleFlight.lead`
starts the flights of the keys nobody runs yet, and :meth:`SingleFlight.land` ends each with its result or
exception; callers of those keys meanwhile wait for the batch as for any flight.

Primitives:
    SingleFlight: ``run(key, fn) -> (result, joined)``; ``lead(keys)`` and ``land(key, result)`` for a batch;
        ``joins`` counts callers that shared a flight.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from typing import Generic, TypeVar

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


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

    def lead(self, keys: Sequence[K]) -> list[K]:
        """Start a flight for each of ``keys`` that none runs yet; returns those keys, in order.

        The caller must end every flight it got with :meth:`land` (a ``finally``): until then, callers of
        those keys wait.
        """
        led: list[K] = []
        with self._lock:
            for key in keys:
                if key not in self._flights:
                    self._flights[key] = Future()
                    led.append(key)
        return led

    def land(self, key: Hashable, result: T | BaseException) -> None:
        """End a flight started by :meth:`lead`: its waiting callers get ``result``, or raise it."""
        with self._lock:
            flight = self._flights.pop(key)
        if isinstance(result, BaseException):
            flight.set_exception(result)
        else:
            flight.set_result(result)
