"""The L3 config's own module: its public home is tiers.lmdb, and it prices a chunk before any reservation."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiercache.errors import InvalidArgumentError
from tiercache.tiers import lmdb, lmdb_config
from tiercache.tiers.values import HEADER_BYTES


def test_the_config_is_exported_by_the_tier_module() -> None:
    assert lmdb.LmdbTierConfig is lmdb_config.LmdbTierConfig
    assert set(lmdb.__all__) == {"LmdbTier", "LmdbTierConfig"}


def test_a_chunk_is_charged_its_header_and_payload(tmp_path: Path) -> None:
    config = lmdb_config.LmdbTierConfig(path=str(tmp_path / "l3"), capacity_bytes=HEADER_BYTES + 100)
    assert config.charge(1) == HEADER_BYTES + 1
    assert config.charge(100) == HEADER_BYTES + 100
    with pytest.raises(InvalidArgumentError, match=r"^sizes: 101 bytes \(\+\d+ header\) exceed the capacity"):
        config.charge(101, "sizes")
    for bad in (0, -1, True, 1.5):
        with pytest.raises(InvalidArgumentError, match=r"^nbytes: must be a positive integer"):
            config.charge(bad)  # type: ignore[arg-type]


def test_a_chunk_over_lmdbs_largest_value_is_refused(tmp_path: Path) -> None:
    config = lmdb_config.LmdbTierConfig(path=str(tmp_path / "l3"), capacity_bytes=1 << 33)
    with pytest.raises(InvalidArgumentError, match="exceed LMDB's largest value"):
        config.charge(1 << 32)


def test_the_tier_charges_what_its_config_charges(tmp_path: Path) -> None:
    tier = lmdb.LmdbTier(lmdb.LmdbTierConfig(path=str(tmp_path / "l3"), capacity_bytes=1 << 20))
    try:
        assert tier.charge(4096) == tier.config.charge(4096) == HEADER_BYTES + 4096
    finally:
        tier.close()
