"""The core enums on the wire: every member round trips by name, a wire value this side does not know fails
naming the field, and a pairing with a member or a wire value on one side only fails when it is built."""

from __future__ import annotations

import enum
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tiercache.codec import Codec
from tiercache.errors import InvalidArgumentError
from tiercache.layout import KVDtype
from tiercache.policies.load import LoadPolicyKind
from tiercache.proto import tiercache_pb2 as pb
from tiercache.tiers.base import TierLevel
from tiercache.wire import (
    CODECS,
    DTYPES,
    LOAD_POLICIES,
    TIERS,
    EnumPair,
    SchemaError,
    pair_enum,
    tier_to_proto,
)

PAIRS: dict[str, tuple[EnumPair[Any, Any], type[enum.Enum], str]] = {
    "tier": (TIERS, TierLevel, "TIER_"),
    "codec": (CODECS, Codec, "CODEC_"),
    "dtype": (DTYPES, KVDtype, "KV_DTYPE_"),
    "load_policy": (LOAD_POLICIES, LoadPolicyKind, "LOAD_POLICY_"),
}
MEMBERS = [(name, m) for name, (_, members, _) in PAIRS.items() for m in members]


@pytest.mark.parametrize(("pair_name", "member"), MEMBERS, ids=[f"{n}-{m.name}" for n, m in MEMBERS])
def test_every_member_round_trips_under_its_own_name(pair_name: str, member: enum.Enum) -> None:
    pair, _, prefix = PAIRS[pair_name]
    number = pair.to_proto(member)
    assert pair.wire.values_by_number[number].name == f"{prefix}{member.name}"
    assert pair.from_proto(number, "f") is member
    assert pair.lookup(number) is member


@pytest.mark.parametrize("pair_name", PAIRS)
def test_every_wire_value_but_unspecified_has_a_member(pair_name: str) -> None:
    pair, members, prefix = PAIRS[pair_name]
    named = {v.name for v in pair.wire.values} - {f"{prefix}UNSPECIFIED"}
    assert {pair.wire.values_by_number[pair.to_proto(m)].name for m in members} == named
    assert len(pair.from_wire) == len(members)


def test_the_pairings_are_the_ones_the_messages_use() -> None:
    assert TIERS.wire is pb.Tier.DESCRIPTOR and pb.Layout.DESCRIPTOR.fields_by_name["dtype"].enum_type is (
        DTYPES.wire
    )
    assert TIERS.to_proto(TierLevel.L3) == pb.TIER_L3
    assert CODECS.to_proto(Codec.ZSTD) == pb.CODEC_ZSTD
    assert DTYPES.to_proto(KVDtype.FP8_E4M3) == pb.KV_DTYPE_FP8_E4M3
    assert LOAD_POLICIES.to_proto(LoadPolicyKind.COST_AWARE) == pb.LOAD_POLICY_COST_AWARE
    assert tier_to_proto(None) == pb.TIER_UNSPECIFIED
    assert tier_to_proto(TierLevel.L1) == pb.TIER_L1


@pytest.mark.parametrize(
    ("pair", "value", "message"),
    [
        (TIERS, pb.TIER_UNSPECIFIED, "0 is not a tier; valid: TIER_L1, TIER_L2, TIER_L3, TIER_SHARED"),
        (TIERS, 7, "7 is not a tier; valid: TIER_L1, TIER_L2, TIER_L3, TIER_SHARED"),
        (CODECS, 9, "9 is not a codec; valid: CODEC_RAW, CODEC_ZSTD"),
        (
            DTYPES,
            pb.KV_DTYPE_UNSPECIFIED,
            "0 is not a KV dtype; valid: KV_DTYPE_FLOAT32, KV_DTYPE_FLOAT16, KV_DTYPE_BFLOAT16, "
            "KV_DTYPE_FP8_E4M3, KV_DTYPE_FP8_E5M2, KV_DTYPE_INT8",
        ),
        (
            LOAD_POLICIES,
            12,
            "12 is not a load policy; valid: LOAD_POLICY_WAIT_COMPLETE, LOAD_POLICY_BEST_EFFORT, "
            "LOAD_POLICY_TIMEOUT, LOAD_POLICY_COST_AWARE",
        ),
    ],
)
def test_an_unknown_wire_value_fails_naming_the_field(
    pair: EnumPair[Any, Any], value: int, message: str
) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        pair.from_proto(value, "things[2].kind")
    assert info.value.field == "things[2].kind"
    assert str(info.value) == f"things[2].kind: {message}"
    assert pair.lookup(value) is None


@given(st.integers(min_value=-(2**31), max_value=2**31 - 1))
def test_any_wire_number_is_a_member_or_a_named_failure(value: int) -> None:
    for pair, members, _ in PAIRS.values():
        member = pair.lookup(value)
        if member is None:
            with pytest.raises(InvalidArgumentError, match=r"^x\.y: "):
                pair.from_proto(value, "x.y")
        else:
            assert isinstance(member, members) and pair.to_proto(member) == value


class _Shuffled(enum.Enum):
    """Names line up with the wire, values do not: pairing goes by name."""

    L3 = 1
    L1 = 2
    L2 = 3
    SHARED = 0


class _ExtraMember(enum.Enum):
    L1 = 1
    L2 = 2
    L3 = 3
    SHARED = 4
    L4 = 5


class _MissingMember(enum.Enum):
    L1 = 1
    L2 = 2


def test_pairing_goes_by_name_not_by_number() -> None:
    pair = pair_enum(_Shuffled, pb.Tier.DESCRIPTOR)
    assert pair.to_proto(_Shuffled.L3) == pb.TIER_L3
    assert pair.from_proto(pb.TIER_L1, "tier") is _Shuffled.L1
    assert pair.noun == "tier"


def test_a_member_or_wire_value_on_one_side_only_fails_loudly() -> None:
    with pytest.raises(SchemaError, match=r"_ExtraMember\.L4 has no tiercache\.v1\.Tier TIER_L4"):
        pair_enum(_ExtraMember, pb.Tier.DESCRIPTOR)
    with pytest.raises(SchemaError, match=r"\['TIER_L3', 'TIER_SHARED'\] have no _MissingMember member"):
        pair_enum(_MissingMember, pb.Tier.DESCRIPTOR)
    with pytest.raises(SchemaError, match=r"TierLevel\.L1 has no tiercache\.v1\.Codec CODEC_L1"):
        pair_enum(TierLevel, pb.Codec.DESCRIPTOR)


def test_the_noun_comes_from_the_wire_enum_unless_given() -> None:
    assert LOAD_POLICIES.noun == "load policy"
    assert pair_enum(KVDtype, pb.KVDtype.DESCRIPTOR).noun == "kv dtype"
    assert DTYPES.noun == "KV dtype"
