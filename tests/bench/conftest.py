"""Fixtures of the bench tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def work(tmp_path: Path) -> Iterator[Path]:
    """A ``--dir`` for one run; the run must leave it empty (its work directory removed)."""
    root = tmp_path / "work"
    root.mkdir()
    yield root
    assert list(root.iterdir()) == [], "the run's work directory must be removed"
