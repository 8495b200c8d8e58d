"""The stats schema on the wire: ``CacheStats`` <-> ``StatsResponse``, derived from the dataclass fields.

Each stats dataclass of :mod:`tiercache.stats` pairs with one ``tiercache.v1`` message (:data:`MESSAGES`),
and their fields pair by name (:func:`tiercache.stats.wire_name`). Pairing checks that every dataclass field
has a message field and vice versa, that scalar types agree, that nested stats pair with the nested
messages and that enum members pair with the wire enum's values by name (:func:`~tiercache.wire.enums.
pair_enum`: ``TierLevel.L1`` <-> ``TIER_L1``); any disagreement raises
:class:`~tiercache.wire.enums.SchemaError` naming the fields when this module is imported. No field is
listed by hand: a new figure is a field in :mod:`tiercache.stats` and in the ``.proto``.

Used by the daemon (``Stats`` answers) and the connector (``TierCacheClient.stats()``), which share it so
that both directions come from the same pairing.

Primitives:
    MESSAGES: stats dataclass -> message class.
    FieldPair, pair_fields: the checked pairing of one dataclass with one message.
    stats_to_proto, stats_from_proto: the conversions.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, cast

from google.protobuf.descriptor import EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

from tiercache.proto import tiercache_pb2 as pb
from tiercache.stats import CacheStats, PrefillStats, TierStats, wire_name

from .enums import EnumPair, SchemaError, pair_enum

MESSAGES: MappingProxyType[type, type[Message]] = MappingProxyType(
    {CacheStats: pb.StatsResponse, TierStats: pb.TierStats, PrefillStats: pb.PrefillStats}
)
"""Each stats dataclass and the message it travels as."""

_SCALARS: dict[int, type] = {
    FieldDescriptor.CPPTYPE_DOUBLE: float,
    FieldDescriptor.CPPTYPE_FLOAT: float,
    FieldDescriptor.CPPTYPE_INT32: int,
    FieldDescriptor.CPPTYPE_INT64: int,
    FieldDescriptor.CPPTYPE_UINT32: int,
    FieldDescriptor.CPPTYPE_UINT64: int,
    FieldDescriptor.CPPTYPE_BOOL: bool,
    FieldDescriptor.CPPTYPE_STRING: str,
}
"""Python type of each scalar wire type."""


class Shape(enum.Enum):
    """How a field travels."""

    SCALAR = "scalar"
    ENUM = "enum"
    MESSAGE = "message"
    REPEATED = "repeated"
    """A tuple of nested stats as a repeated message field."""


@dataclass(frozen=True, slots=True)
class FieldPair:
    """One dataclass field and its message field.

    Attributes:
        name: the dataclass field.
        wire: the message field.
        shape: how it travels.
        nested: for MESSAGE / REPEATED, the nested stats dataclass.
        members: for ENUM, the pairing of the field's enum with the wire enum.
    """

    name: str
    wire: str
    shape: Shape
    nested: type | None = None
    members: EnumPair[Any, Any] | None = None


def _element(hint: Any) -> Any:
    """``X`` of ``tuple[X, ...]`` (else None)."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is tuple and len(args) == 2 and args[1] is Ellipsis:
        return args[0]
    return None


def pair_fields(cls: type, message: type[Message]) -> tuple[FieldPair, ...]:
    """The pairing of a stats dataclass's fields with a message's fields.

    Raises:
        SchemaError: a field on one side only, a scalar of another type, a nested dataclass that does not
            travel as the nested message, or enum members and wire values that do not pair.
    """
    descriptor = message.DESCRIPTOR
    hints = typing.get_type_hints(cls)
    fields = {wire_name(f): f for f in dataclasses.fields(cls)}
    only_here = sorted(set(fields) - set(descriptor.fields_by_name))
    only_wire = sorted(set(descriptor.fields_by_name) - set(fields))
    if only_here or only_wire:
        raise SchemaError(
            f"{cls.__name__} vs {descriptor.full_name}: fields without a wire field {only_here}, "
            f"wire fields without a dataclass field {only_wire}"
        )
    pairs = []
    for wire, f in fields.items():
        fd = descriptor.fields_by_name[wire]
        hint = hints[f.name]
        where = f"{cls.__name__}.{f.name} / {descriptor.name}.{wire}"
        if fd.message_type is not None:
            nested = _element(hint) if fd.is_repeated else hint
            if nested not in MESSAGES or MESSAGES[nested].DESCRIPTOR is not fd.message_type:
                raise SchemaError(f"{where}: {hint} does not travel as {fd.message_type.full_name}")
            pairs.append(FieldPair(f.name, wire, Shape.REPEATED if fd.is_repeated else Shape.MESSAGE, nested))
        elif fd.is_repeated:
            raise SchemaError(f"{where}: repeated scalars are not stats")
        elif fd.enum_type is not None:
            if not (isinstance(hint, type) and issubclass(hint, enum.Enum)):
                raise SchemaError(f"{where}: {hint} is not an enum, the wire field is {fd.enum_type.name}")
            try:
                members = pair_enum(hint, cast(EnumDescriptor, fd.enum_type))
            except SchemaError as exc:
                raise SchemaError(f"{where}: {exc}") from None
            pairs.append(FieldPair(f.name, wire, Shape.ENUM, members=members))
        elif _SCALARS.get(fd.cpp_type) is not hint:
            raise SchemaError(f"{where}: {hint} travels as {_SCALARS.get(fd.cpp_type)}")
        else:
            pairs.append(FieldPair(f.name, wire, Shape.SCALAR))
    return tuple(pairs)


_PAIRS: MappingProxyType[type, tuple[FieldPair, ...]] = MappingProxyType(
    {cls: pair_fields(cls, message) for cls, message in MESSAGES.items()}
)
"""The checked pairing of every stats dataclass (built, and checked, at import)."""


def _to_proto(value: Any) -> Message:
    cls = type(value)
    kwargs: dict[str, Any] = {}
    for p in _PAIRS[cls]:
        v = getattr(value, p.name)
        if p.shape is Shape.REPEATED:
            v = [_to_proto(item) for item in v]
        elif p.shape is Shape.MESSAGE:
            v = _to_proto(v)
        elif p.shape is Shape.ENUM:
            assert p.members is not None
            v = p.members.to_proto(v)
        kwargs[p.wire] = v
    return MESSAGES[cls](**kwargs)


def _from_proto(cls: type, msg: Message, path: str) -> Any:
    kwargs: dict[str, Any] = {}
    for p in _PAIRS[cls]:
        v = getattr(msg, p.wire)
        if p.shape is Shape.REPEATED:
            assert p.nested is not None
            v = tuple(_from_proto(p.nested, item, f"{path}{p.wire}[{i}].") for i, item in enumerate(v))
        elif p.shape is Shape.MESSAGE:
            assert p.nested is not None
            v = _from_proto(p.nested, v, f"{path}{p.wire}.")
        elif p.shape is Shape.ENUM:
            assert p.members is not None
            v = p.members.from_proto(v, f"{path}{p.wire}")
        kwargs[p.name] = v
    return cls(**kwargs)


def stats_to_proto(stats: CacheStats) -> pb.StatsResponse:
    """The ``StatsResponse`` of a stats snapshot."""
    msg = _to_proto(stats)
    assert isinstance(msg, pb.StatsResponse)
    return msg


def stats_from_proto(msg: pb.StatsResponse) -> CacheStats:
    """The stats snapshot of a ``StatsResponse``.

    Raises:
        InvalidArgumentError: an enum value this side does not know (e.g. ``tiers[0].tier``: a tier newer
            than this code, or TIER_UNSPECIFIED).
    """
    stats = _from_proto(CacheStats, msg, "")
    assert isinstance(stats, CacheStats)
    return stats
