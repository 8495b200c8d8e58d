"""The suite's tiers (``tests/conftest.py``): every test directory has one, every entry names a real path,
the longest entry wins, and a collected test carries its tier's marker and timeout."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import TIERS, TIMEOUT_S, Tier, tier_of

ROOT = Path(__file__).resolve().parent.parent


def test_every_test_directory_has_a_tier() -> None:
    dirs = {p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py")}
    files = [p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").glob("test_*.py")]
    assert len(dirs) > 10
    untiered = sorted(d for d in dirs if d != "tests" and tier_of(d) is None)
    assert untiered == [], f"add these directories to TIERS in tests/conftest.py: {untiered}"
    assert sorted(f for f in files if tier_of(f) is None) == []


def test_every_entry_names_a_path_that_exists() -> None:
    assert sorted(p for p in TIERS if not (ROOT / p).exists()) == []


def test_the_longest_entry_wins() -> None:
    assert tier_of("tests/connector/test_rpcs.py") is Tier.INTEGRATION
    assert tier_of("tests/connector/vllm/test_engines.py") is Tier.E2E
    assert tier_of("tests/shared/test_faults.py") is Tier.CHAOS
    assert tier_of("tests/shared/test_placement.py") is Tier.E2E
    assert tier_of("tests/tiercache/cache/test_manager.py") is Tier.UNIT
    assert tier_of("tests/new_dir/test_x.py") is None
    assert tier_of("tests") is None


def test_a_test_carries_its_tier_and_timeout(request: pytest.FixtureRequest) -> None:
    node = request.node
    assert [t for t in Tier if node.get_closest_marker(t.value)] == [Tier.UNIT]
    timeout = node.get_closest_marker("timeout")
    if request.config.pluginmanager.hasplugin("timeout"):
        assert timeout is not None and timeout.args == (TIMEOUT_S[Tier.UNIT],)
