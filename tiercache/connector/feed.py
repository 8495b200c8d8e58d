"""The request iterator of a client-streaming call, shut when the call ends.

gRPC pulls a client stream's requests on a thread of its own, a daemon thread. The byte-stream store's
requests are lazy: pulling one reads the engine's tensors (torch gathers, views of its memory). When a call
ends before its requests do (the daemon refused the stream, a deadline), the caller got its answer while
that thread could still be inside the engine's code, and keep going there after the caller returned. A
daemon thread still inside a torch op when the interpreter exits is killed in a C++ destructor: the process
aborts ("terminate called without an active exception", exit -6) after having done its work.

:class:`RequestFeed` is what gRPC pulls instead: :meth:`RequestFeed.shut`, called by the caller once the call
has ended, waits for a pull in progress, refuses every later pull, and closes the requests on the caller's
thread (a generator's ``finally`` blocks and context managers run there). It also keeps the first exception
the requests raised, which gRPC turns into a CANCELLED status.

Primitives:
    RequestFeed: iterate (gRPC), failure, shut.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class RequestFeed(Generic[T]):
    """The requests of one client-streaming call, pulled by gRPC until :meth:`shut`. Thread-safe.

    Attributes:
        failure: the first exception the requests raised (None: none did).
    """

    def __init__(self, requests: Iterator[T]) -> None:
        self._requests = requests
        self._lock = threading.Lock()
        self._shut = False
        self.failure: BaseException | None = None

    def __iter__(self) -> RequestFeed[T]:
        return self

    def __next__(self) -> T:
        with self._lock:
            if self._shut:
                raise StopIteration
            try:
                return next(self._requests)
            except StopIteration:
                raise
            except BaseException as exc:
                if self.failure is None:
                    self.failure = exc
                raise

    def shut(self) -> None:
        """End the feed (idempotent): wait until no pull is in progress, then close the requests here."""
        with self._lock:
            self._shut = True
            close = getattr(self._requests, "close", None)
            if close is not None:
                close()
