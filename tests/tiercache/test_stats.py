"""The stats schema: every figure carries its meaning, and the wire conversion is derived from the fields
(checked against the message descriptors both ways, round trips exactly, fails loudly on a disagreement)."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field

import pytest

from tiercache.errors import InvalidArgumentError
from tiercache.proto import tiercache_pb2 as pb
from tiercache.stats import (
    CacheStats,
    PrefillStats,
    StatKind,
    TierStats,
    counter,
    gauge,
    stat_info,
    wire_name,
)
from tiercache.tiers.base import TierLevel
from tiercache.wire.enums import SchemaError
from tiercache.wire.stats import MESSAGES, pair_fields, stats_from_proto, stats_to_proto

SCHEMA = (TierStats, PrefillStats, CacheStats)


def test_every_figure_says_what_it_counts() -> None:
    structural = set()
    for cls in SCHEMA:
        for f in dataclasses.fields(cls):
            info = stat_info(f)
            if info is None:
                structural.add(f"{cls.__name__}.{f.name}")
            else:
                assert info.help and info.help[0].isupper(), f"{cls.__name__}.{f.name}"
    assert structural == {"TierStats.level", "CacheStats.tiers", "CacheStats.prefill"}
    kinds = {f.name: stat_info(f).kind for f in dataclasses.fields(TierStats) if stat_info(f)}  # type: ignore[union-attr]
    assert kinds["chunks"] is StatKind.GAUGE and kinds["latency_s"] is StatKind.GAUGE
    assert kinds["hits"] is StatKind.COUNTER and kinds["corrupt_reads"] is StatKind.COUNTER


def test_every_field_has_a_wire_field_of_its_name_and_back() -> None:
    # Checked here straight against the descriptors, independently of the pairing code.
    for cls, message in MESSAGES.items():
        names = {wire_name(f) for f in dataclasses.fields(cls)}
        assert names == set(message.DESCRIPTOR.fields_by_name), cls.__name__
    assert {f.name: wire_name(f) for f in dataclasses.fields(TierStats)}["level"] == "tier"
    assert set(MESSAGES) == set(SCHEMA)


def _sample() -> CacheStats:
    """Stats with a distinct value in every field (so a swapped pair of fields cannot round trip)."""
    counter_values = iter(range(1, 1000))

    def fill(cls: type, **given: object) -> object:
        values: dict[str, object] = {}
        for f in dataclasses.fields(cls):
            if f.name in given:
                values[f.name] = given[f.name]
            elif f.type == "float":
                values[f.name] = next(counter_values) + 0.25
            else:
                values[f.name] = next(counter_values)
        return cls(**values)

    tiers = tuple(fill(TierStats, level=level) for level in TierLevel)
    return fill(CacheStats, tiers=tiers, prefill=fill(PrefillStats))  # type: ignore[return-value]


def test_stats_round_trip_through_the_wire_exactly() -> None:
    stats = _sample()
    msg = stats_to_proto(stats)
    assert [t.tier for t in msg.tiers] == [pb.TIER_L1, pb.TIER_L2, pb.TIER_L3, pb.TIER_SHARED]
    assert msg.tiers[2].corrupt_reads == stats.tier(TierLevel.L3).corrupt_reads
    assert msg.tiers[0].latency_s == stats.tiers[0].latency_s
    assert msg.prefill.expired_claims == stats.prefill.expired_claims
    assert msg.recomputed_tokens == stats.recomputed_tokens
    back = stats_from_proto(pb.StatsResponse.FromString(msg.SerializeToString()))
    assert back == stats
    assert stats_from_proto(pb.StatsResponse()) == CacheStats(
        (), 0, 0, 0, 0, 0, 0, PrefillStats(0, 0, 0, 0, 0)
    )


def test_a_tier_this_side_does_not_know_names_the_field() -> None:
    msg = stats_to_proto(_sample())
    msg.tiers[1].tier = pb.TIER_UNSPECIFIED
    with pytest.raises(InvalidArgumentError, match=r"tiers\[1\]\.tier"):
        stats_from_proto(msg)


@dataclass(frozen=True, slots=True)
class _ExtraField:
    active_claims: int = field(metadata=gauge("Claims"))
    claimed_chunks: int = field(metadata=gauge("Chunks"))
    waits: int = field(metadata=counter("Waits"))
    takeovers: int = field(metadata=counter("Takeovers"))
    expired_claims: int = field(metadata=counter("Expired"))
    brand_new: int = field(metadata=counter("Not on the wire"))


@dataclass(frozen=True, slots=True)
class _MissingField:
    active_claims: int
    claimed_chunks: int
    waits: int
    takeovers: int


@dataclass(frozen=True, slots=True)
class _WrongType:
    active_claims: int
    claimed_chunks: int
    waits: float
    takeovers: int
    expired_claims: int


@dataclass(frozen=True, slots=True)
class _NotAnEnum:
    tier: int
    chunks: int


class _TwoTiers(enum.IntEnum):
    L1 = 1
    L2 = 2


@dataclass(frozen=True, slots=True)
class _FewerMembers:
    tier: _TwoTiers
    chunks: int


def test_a_disagreement_with_the_message_fails_loudly() -> None:
    assert len(pair_fields(PrefillStats, pb.PrefillStats)) == 5
    with pytest.raises(SchemaError, match="brand_new"):
        pair_fields(_ExtraField, pb.PrefillStats)
    with pytest.raises(SchemaError, match="expired_claims"):
        pair_fields(_MissingField, pb.PrefillStats)
    with pytest.raises(SchemaError, match="waits"):
        pair_fields(_WrongType, pb.PrefillStats)
    with pytest.raises(SchemaError, match="TierStats"):
        pair_fields(PrefillStats, pb.TierStats)  # neither side's fields are the other's
    with pytest.raises(SchemaError):
        pair_fields(TierStats, pb.TierCount)
    with pytest.raises(SchemaError, match="not an enum"):
        pair_fields(_NotAnEnum, pb.TierCount)
    with pytest.raises(SchemaError, match="TIER_L3"):
        pair_fields(_FewerMembers, pb.TierCount)
