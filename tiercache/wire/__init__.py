"""The one place where the core's shared values meet their ``tiercache.v1`` messages, in both directions.

The daemon (reading requests, writing responses) and the connector (writing requests, reading responses)
both convert through here, so a value travels the same way both ways and a wire value this side does not
know fails the same way, with :class:`~tiercache.errors.InvalidArgumentError` naming the field. Core: imports
only core modules and :mod:`tiercache.proto`. Request-specific checks (key lengths, lifetimes, timeouts)
stay with the daemon.

Primitives:
    SchemaError, EnumPair, pair_enum: checked name-pairings of a core enum with a wire enum.
    TIERS, CODECS, DTYPES, LOAD_POLICIES, tier_to_proto: TierLevel, Codec, KVDtype, LoadPolicyKind.
    layout_to_proto / layout_from_proto, namespace_to_proto / namespace_from_proto,
    prefill_to_proto / prefill_from_proto, deadline_to_proto / deadline_from_proto: the value messages.
    stats_to_proto, stats_from_proto: the stats schema.

Modules:
    enums: the enum pairings.
    models: KVLayout, Namespace, PrefillModel, DeadlineModel.
    stats: CacheStats <-> StatsResponse, derived from the dataclass fields.
"""

from tiercache.wire.enums import (
    CODECS,
    DTYPES,
    LOAD_POLICIES,
    TIERS,
    EnumPair,
    SchemaError,
    pair_enum,
    tier_to_proto,
)
from tiercache.wire.models import (
    deadline_from_proto,
    deadline_to_proto,
    layout_from_proto,
    layout_to_proto,
    namespace_from_proto,
    namespace_to_proto,
    prefill_from_proto,
    prefill_to_proto,
)
from tiercache.wire.stats import stats_from_proto, stats_to_proto

__all__ = [
    "CODECS",
    "DTYPES",
    "LOAD_POLICIES",
    "TIERS",
    "EnumPair",
    "SchemaError",
    "deadline_from_proto",
    "deadline_to_proto",
    "layout_from_proto",
    "layout_to_proto",
    "namespace_from_proto",
    "namespace_to_proto",
    "pair_enum",
    "prefill_from_proto",
    "prefill_to_proto",
    "stats_from_proto",
    "stats_to_proto",
    "tier_to_proto",
]
