"""Fixtures of the SGLang backend's tests: real daemon processes whose slots hold a whole SGLang page, and
the backends a test attached (closed after it). SGLang's own parts (host pools, storage config, factory)
come from :mod:`tiercache.testing.sglang`.

SGLang comes from the ``sglang`` extra (``tests/run`` installs it); without it the test modules skip with
``tiercache.testing.sglang.MISSING`` as the reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tiercache.testing.plugin import SMALL_DAEMON_ARGS

DAEMON_ARGS = tuple("256K" if a == "64K" else a for a in SMALL_DAEMON_ARGS)
"""Small daemons whose slots hold a whole page of the test pools (128 KiB; chunks up to 256 KiB)."""


@pytest.fixture(scope="session")
def daemon_args() -> tuple[str, ...]:
    """This directory's daemon options (see :data:`DAEMON_ARGS`)."""
    return DAEMON_ARGS


@pytest.fixture
def backends() -> Iterator[list[Any]]:
    """Backends a test attached (append them), closed after it."""
    made: list[Any] = []
    yield made
    for backend in made:
        backend.close()
