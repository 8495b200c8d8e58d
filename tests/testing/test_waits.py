"""wait_until: returns once its predicate holds, fails naming what it waited for after the deadline."""

from __future__ import annotations

import pytest

from tiercache.testing.waits import WaitTimeout, wait_until


def test_a_true_predicate_returns_at_once_and_is_asked_once() -> None:
    asked: list[int] = []
    wait_until(lambda: asked.append(1) or True, 30.0, "nothing")
    assert asked == [1]


def test_a_predicate_that_never_holds_fails_naming_what_was_awaited() -> None:
    with pytest.raises(WaitTimeout, match=r"timed out after 0.1 s waiting for the lease to be released"):
        wait_until(lambda: False, 0.1, "the lease to be released", poll_s=0.02)
    assert issubclass(WaitTimeout, AssertionError)  # a test failure, not an error
