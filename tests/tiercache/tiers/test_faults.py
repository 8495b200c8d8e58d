"""Read fault injection: validation (naming the tier config's fields) and the delay it adds."""

from __future__ import annotations

from typing import Any

import pytest

from tiercache.errors import InvalidArgumentError
from tiercache.tiers.faults import ReadFaults
from tiercache.tiers.lmdb import LmdbTierConfig


def test_delay_is_fixed_plus_throttled_bytes() -> None:
    assert ReadFaults().delay_for(1 << 30) == 0.0
    assert ReadFaults(delay_s=0.25).delay_for(1000) == 0.25
    assert ReadFaults(bytes_per_s=1000).delay_for(500) == 0.5
    assert ReadFaults(0.1, 2000).delay_for(1000) == pytest.approx(0.6)
    ReadFaults().inject(1 << 30)  # off: returns at once


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"delay_s": -0.1}, "fault_read_delay_s"),
        ({"delay_s": float("nan")}, "fault_read_delay_s"),
        ({"delay_s": True}, "fault_read_delay_s"),
        ({"bytes_per_s": -1}, "fault_read_bytes_per_s"),
        ({"bytes_per_s": 1.5}, "fault_read_bytes_per_s"),
        ({"bytes_per_s": True}, "fault_read_bytes_per_s"),
    ],
)
def test_bad_values_name_the_config_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        ReadFaults(**kwargs)
    assert info.value.field == field
    config_kwargs = {"fault_read_" + k: v for k, v in kwargs.items()}
    with pytest.raises(InvalidArgumentError) as info:
        LmdbTierConfig(path="/tmp/unused", capacity_bytes=1 << 20, **config_kwargs)
    assert info.value.field == field


def test_the_tier_config_carries_its_faults() -> None:
    config = LmdbTierConfig(path="/tmp/unused", capacity_bytes=1 << 20, fault_read_delay_s=0.5)
    assert config.read_faults == ReadFaults(delay_s=0.5)
