"""Reconnect backoff with an injected clock."""

from __future__ import annotations

import pytest

from tiercache.connector.backoff import Backoff, BackoffConfig
from tiercache.errors import InvalidArgumentError


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_grows_caps_and_resets() -> None:
    clock = Clock()
    b = Backoff(BackoffConfig(initial_s=0.1, factor=2, max_s=0.3), clock)
    assert b.remaining_s() == 0
    assert [b.failed() for _ in range(4)] == [0.1, 0.2, 0.3, 0.3]
    assert b.remaining_s() == pytest.approx(0.3)
    clock.now += 0.2
    assert b.remaining_s() == pytest.approx(0.1)
    clock.now += 0.2
    assert b.remaining_s() == 0
    b.succeeded()
    assert b.failures == 0 and b.failed() == 0.1


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"initial_s": 0}, "initial_s"),
        ({"initial_s": 2, "max_s": 1}, "initial_s"),
        ({"factor": 0.5}, "factor"),
    ],
)
def test_bad_config(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(InvalidArgumentError, match=f"^{field}:"):
        BackoffConfig(**kwargs)
