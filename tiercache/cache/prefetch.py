"""The prefetcher: background promotions of a chain's cached prefix into a slot tier.

Promotions run on a small pool of threads through the mover, so a prefetch of a chunk coalesces with any
other move of it into the same tier (one read). The bytes of promotions in flight are bounded, so that
prefetching cannot take every free slot from stores; one promotion larger than the bound may run alone.
A cancelled prefetch drops the promotions that have not started.

Every wait on a promotion goes through :func:`wait_until` (a load that waits up to a deadline, and
:meth:`~tiercache.cache.results.Prefetch.ready` which waits not at all).

Primitives:
    ByteBudget: acquire / release of in-flight bytes.
    Prefetcher: start (returns a :class:`~tiercache.cache.results.Prefetch`), close.
    wait_until: a promotion's result if it arrives before a deadline, else False.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from tiercache.cache.results import Prefetch
from tiercache.tiers.base import TierLevel


def wait_until(future: Future[bool], deadline: float) -> bool:
    """A promotion's result if it arrives before ``deadline`` (``time.monotonic``), else False."""
    remaining = deadline - time.monotonic()
    if remaining <= 0 and not future.done():
        return False
    try:
        return future.result(timeout=max(0.0, remaining))
    except (FutureTimeout, CancelledError):
        return False


class ByteBudget:
    """Bounds the bytes of promotions in flight; one oversized promotion may run alone."""

    def __init__(self, limit: int) -> None:
        """Args: limit: bytes in flight at once."""
        self._limit = limit
        self._used = 0
        self._cond = threading.Condition()

    def acquire(self, nbytes: int) -> None:
        """Wait until ``nbytes`` more fit (or nothing is in flight), then take them."""
        with self._cond:
            self._cond.wait_for(lambda: self._used == 0 or self._used + nbytes <= self._limit)
            self._used += nbytes

    def release(self, nbytes: int) -> None:
        """Give back bytes taken by :meth:`acquire`."""
        with self._cond:
            self._used -= nbytes
            self._cond.notify_all()


class Prefetcher:
    """Background promotions with a bound on the bytes in flight."""

    def __init__(self, workers: int, inflight_bytes: int, move: Callable[[bytes, TierLevel], bool]) -> None:
        """Args: workers: promotion threads; inflight_bytes: the byte bound; move: the mover's promotion."""
        self._move = move
        self._budget = ByteBudget(inflight_bytes)
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tiercache-prefetch")

    def start(self, chunks: Sequence[tuple[bytes, int, bool]], target: TierLevel) -> Prefetch:
        """Promote chunks into ``target``.

        Args:
            chunks: ``(chunk id, bytes, already in target)`` per chunk of the cached prefix, in chain order.
            target: a slot tier.
        """
        cancelled = threading.Event()
        futures: list[Future[bool]] = []
        for cid, nbytes, present in chunks:
            if present:
                done: Future[bool] = Future()
                done.set_result(True)
                futures.append(done)
            else:
                futures.append(self._executor.submit(self._promote, cid, target, nbytes, cancelled))
        return Prefetch(futures, cancelled)

    def close(self) -> None:
        """Drop promotions not started and wait for the running ones."""
        self._executor.shutdown(wait=True, cancel_futures=True)

    def _promote(self, cid: bytes, target: TierLevel, nbytes: int, cancelled: threading.Event) -> bool:
        if cancelled.is_set():
            return False
        self._budget.acquire(nbytes)
        try:
            return not cancelled.is_set() and self._move(cid, target)
        finally:
            self._budget.release(nbytes)
