"""Waiting, with a deadline, for what a daemon or a background thread does on its own.

A test that needs a daemon's background work done (a lease released at its TTL, a write-down, a promotion,
a reconnect) asks for it through the daemon's API until it holds. The state lives in another process, so
there is nothing to wait on but that answer: :func:`wait_until` asks again after a short pause, and fails
with what was awaited once the deadline has passed.

Primitives:
    wait_until: poll a predicate until it holds or a deadline passes.
    WaitTimeout: the failure (an ``AssertionError``: a test failure, not an error).
"""

from __future__ import annotations

import time
from collections.abc import Callable

POLL_S = 0.05
"""The default pause between two polls."""


class WaitTimeout(AssertionError):
    """What a test waited for did not happen before its deadline."""


def wait_until(
    predicate: Callable[[], object],
    timeout_s: float,
    what: str,
    poll_s: float = POLL_S,
) -> None:
    """Return once ``predicate()`` is true; raise :class:`WaitTimeout` naming ``what`` after ``timeout_s``.

    Args:
        predicate: asked first at once, then after each pause (its truth value counts).
        timeout_s: how long to wait in all.
        what: what is awaited, for the failure message ("the lease to be released").
        poll_s: the pause between two polls.

    Raises:
        WaitTimeout: the predicate was still false at the deadline.
    """
    deadline = time.monotonic() + timeout_s
    while not predicate():
        left = deadline - time.monotonic()
        if left <= 0:
            raise WaitTimeout(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(min(poll_s, left))
