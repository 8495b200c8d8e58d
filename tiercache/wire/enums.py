"""The core's enums and their ``tiercache.v1`` wire enums, paired by name in both directions.

Member ``X`` of a core enum pairs with the wire value ``<ENUM>_X``, where ``<ENUM>`` is the wire enum's name in
upper snake case (``TierLevel.L1`` <-> ``TIER_L1``, ``KVDtype.FP8_E4M3`` <-> ``KV_DTYPE_FP8_E4M3``). Every
member needs a wire value and every wire value but ``<ENUM>_UNSPECIFIED`` needs a member: a pairing that
misses one raises :class:`SchemaError` when it is built, and the pairings below are built when this module is
imported, so a member added on one side only fails loudly at once. Numbers are never compared across the two
sides, so a core enum's values may be anything (names in config files, tier order).

Primitives:
    SchemaError: a core type and its wire counterpart disagree.
    EnumPair, pair_enum: a checked pairing of a core enum with a wire enum.
    TIERS, CODECS, DTYPES, LOAD_POLICIES: TierLevel, Codec, KVDtype and LoadPolicyKind on the wire.
    tier_to_proto: a tier or None (TIER_UNSPECIFIED).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from google.protobuf.descriptor import EnumDescriptor

from tiercache.codec import Codec
from tiercache.errors import InvalidArgumentError
from tiercache.layout import KVDtype
from tiercache.policies.load import LoadPolicyKind
from tiercache.proto import tiercache_pb2 as pb
from tiercache.tiers.base import TierLevel

E = TypeVar("E", bound=enum.Enum)
W = TypeVar("W", bound=int)


class SchemaError(TypeError):
    """A core type and its wire counterpart disagree (a field, a type or an enum value on one side only)."""


def _prefix(wire: EnumDescriptor) -> str:
    """``<ENUM>_``: the prefix of a wire enum's value names (``KVDtype`` -> ``KV_DTYPE_``)."""
    words = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", wire.name)
    return f"{words.upper()}_"


@dataclass(frozen=True, slots=True)
class EnumPair(Generic[E, W]):
    """A checked pairing of a core enum with a wire enum (build it with :func:`pair_enum`).

    Attributes:
        members: the core enum.
        wire: the wire enum's descriptor.
        noun: what a value is, for error messages (``"tier"``: ``0 is not a tier; valid: ...``).
        to_wire: member -> wire value.
        from_wire: wire value -> member (``<ENUM>_UNSPECIFIED`` has no entry).
    """

    members: type[E]
    wire: EnumDescriptor
    noun: str
    to_wire: Mapping[E, W]
    from_wire: Mapping[int, E]

    def to_proto(self, member: E) -> W:
        """The wire value of a member."""
        return self.to_wire[member]

    def from_proto(self, value: int, field: str) -> E:
        """The member of a wire value.

        Raises:
            InvalidArgumentError: naming ``field``, for ``<ENUM>_UNSPECIFIED`` or a value this side does not
                know (the message lists the valid names).
        """
        member = self.from_wire.get(int(value))
        if member is None:
            valid = ", ".join(self.wire.values_by_number[int(v)].name for v in self.to_wire.values())
            raise InvalidArgumentError(field, f"{int(value)} is not a {self.noun}; valid: {valid}")
        return member

    def lookup(self, value: int) -> E | None:
        """The member of a wire value, None for ``<ENUM>_UNSPECIFIED`` or a value newer than this code."""
        return self.from_wire.get(int(value))


def pair_enum(members: type[E], wire: EnumDescriptor, noun: str | None = None) -> EnumPair[E, Any]:
    """Pair a core enum's members with a wire enum's values by name.

    Args:
        members: the core enum.
        wire: the wire enum's descriptor (``pb.Tier.DESCRIPTOR``).
        noun: what a value is, for error messages; by default the wire enum's name in words
            (``LoadPolicy``: ``load policy``).

    Raises:
        SchemaError: a member without a wire value, or a wire value (other than ``<ENUM>_UNSPECIFIED``)
            without a member; the message names them.
    """
    prefix = _prefix(wire)
    by_name = {v.name: v.number for v in wire.values}
    to_wire: dict[E, int] = {}
    for member in members:
        number = by_name.pop(f"{prefix}{member.name}", None)
        if number is None:
            raise SchemaError(
                f"{members.__name__}.{member.name} has no {wire.full_name} {prefix}{member.name}"
            )
        to_wire[member] = number
    by_name.pop(f"{prefix}UNSPECIFIED", None)
    if by_name:
        raise SchemaError(f"{wire.full_name} values {sorted(by_name)} have no {members.__name__} member")
    ordered = dict(sorted(to_wire.items(), key=lambda item: item[1]))
    return EnumPair(
        members,
        wire,
        noun or prefix.rstrip("_").replace("_", " ").lower(),
        MappingProxyType(ordered),
        MappingProxyType({number: member for member, number in ordered.items()}),
    )


TIERS: EnumPair[TierLevel, pb.Tier] = pair_enum(TierLevel, pb.Tier.DESCRIPTOR)
"""TierLevel <-> ``Tier`` (TIER_UNSPECIFIED: no tier)."""
CODECS: EnumPair[Codec, pb.Codec] = pair_enum(Codec, pb.Codec.DESCRIPTOR)
"""Codec <-> ``Codec``."""
DTYPES: EnumPair[KVDtype, pb.KVDtype] = pair_enum(KVDtype, pb.KVDtype.DESCRIPTOR, "KV dtype")
"""KVDtype <-> ``KVDtype`` (KV_DTYPE_UNSPECIFIED is no dtype)."""
LOAD_POLICIES: EnumPair[LoadPolicyKind, pb.LoadPolicy] = pair_enum(LoadPolicyKind, pb.LoadPolicy.DESCRIPTOR)
"""LoadPolicyKind <-> ``LoadPolicy``."""


def tier_to_proto(level: TierLevel | None) -> pb.Tier:
    """The wire tier of a tier, TIER_UNSPECIFIED for None (e.g. an event that concerns no tier)."""
    return pb.TIER_UNSPECIFIED if level is None else TIERS.to_proto(level)
