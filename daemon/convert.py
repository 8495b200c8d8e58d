"""Conversions between the wire messages of ``tiercache.v1`` and the core's types.

Every conversion from the wire validates what it converts and raises
:class:`~tiercache.errors.InvalidArgumentError` naming the field by its path in the request
(``namespace.layout.dtype``, ``keys[3]``, ``ttl_s``).

Primitives:
    namespace_from_proto, layout_to_proto: NamespaceSpec -> Namespace, KVLayout -> Layout.
    keys_from_proto, check_key_field: 32-byte chunk keys.
    ttl_from_proto, timeout_from_proto: optional durations (0 means the default / no wait).
    codec_from_proto, tier_to_proto: enums.
    lookup_to_proto, slot_refs, stats_to_proto, event_to_proto: responses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tiercache.errors import InvalidArgumentError
from tiercache.keys import KEY_BYTES, Namespace
from tiercache.layout import KVDtype, KVLayout
from tiercache.manager import LoadChunk, LookupResult, StoreSlot
from tiercache.proto import tiercache_pb2 as pb
from tiercache.stats import CacheStats
from tiercache.tiers.base import TierLevel

from .events import HubEvent, HubEventKind

DTYPES: dict[int, KVDtype] = {
    pb.KV_DTYPE_FLOAT32: KVDtype.FLOAT32,
    pb.KV_DTYPE_FLOAT16: KVDtype.FLOAT16,
    pb.KV_DTYPE_BFLOAT16: KVDtype.BFLOAT16,
    pb.KV_DTYPE_FP8_E4M3: KVDtype.FP8_E4M3,
    pb.KV_DTYPE_FP8_E5M2: KVDtype.FP8_E5M2,
    pb.KV_DTYPE_INT8: KVDtype.INT8,
}
"""Wire dtype -> core dtype (KV_DTYPE_UNSPECIFIED has no entry)."""
_DTYPE_WIRE = {v: k for k, v in DTYPES.items()}
TIERS: dict[TierLevel, pb.Tier] = {
    TierLevel.L1: pb.TIER_L1,
    TierLevel.L2: pb.TIER_L2,
    TierLevel.L3: pb.TIER_L3,
}
"""Core tier -> wire tier."""
_EVENT_KINDS = {
    HubEventKind.STORED: pb.CacheEvent.KIND_STORED,
    HubEventKind.REMOVED: pb.CacheEvent.KIND_REMOVED,
    HubEventKind.CLEARED: pb.CacheEvent.KIND_CLEARED,
}
_CODECS = (pb.CODEC_RAW, pb.CODEC_ZSTD)


def _message(exc: InvalidArgumentError) -> str:
    text = str(exc)
    prefix = f"{exc.field}: "
    return text[len(prefix) :] if text.startswith(prefix) else text


def namespace_from_proto(spec: pb.NamespaceSpec, present: bool, field: str = "namespace") -> Namespace:
    """The core Namespace of a NamespaceSpec.

    ``tp_size`` and ``pp_size`` of 0 (unset in proto3) mean 1; every other field is taken as sent.

    Args:
        spec: the message.
        present: whether the request set it at all.
        field: its path in the request.

    Raises:
        InvalidArgumentError: naming the field, e.g. ``namespace.layout.dtype``.
    """
    if not present:
        raise InvalidArgumentError(field, "is required")
    if not spec.HasField("layout"):
        raise InvalidArgumentError(f"{field}.layout", "is required")
    lay = spec.layout
    dtype = DTYPES.get(int(lay.dtype))
    if dtype is None:
        valid = ", ".join(pb.KVDtype.Name(v) for v in DTYPES)
        raise InvalidArgumentError(
            f"{field}.layout.dtype", f"{int(lay.dtype)} is not a KV dtype; valid: {valid}"
        )
    try:
        layout = KVLayout(
            num_layers=lay.num_layers,
            num_kv_heads=lay.num_kv_heads,
            head_dim=lay.head_dim,
            dtype=dtype,
            chunk_tokens=lay.chunk_tokens,
            page_tokens=lay.page_tokens,
            mla=lay.mla,
        )
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"{field}.layout.{exc.field}", _message(exc)) from None
    try:
        return Namespace(
            model_id=spec.model_id,
            revision=spec.revision,
            layout=layout,
            tokenizer_id=spec.tokenizer_id,
            tp_rank=spec.tp_rank,
            tp_size=spec.tp_size or 1,
            pp_rank=spec.pp_rank,
            pp_size=spec.pp_size or 1,
            adapter_id=spec.adapter_id,
            cache_salt=spec.cache_salt,
        )
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"{field}.{exc.field}", _message(exc)) from None


def layout_to_proto(layout: KVLayout) -> pb.Layout:
    """The wire Layout of a core layout."""
    return pb.Layout(
        num_layers=layout.num_layers,
        num_kv_heads=layout.num_kv_heads,
        head_dim=layout.head_dim,
        dtype=_DTYPE_WIRE[layout.dtype],
        chunk_tokens=layout.chunk_tokens,
        page_tokens=layout.page_tokens,
        mla=layout.mla,
    )


def check_key_field(key: bytes, field: str) -> bytes:
    """``key`` if it is a chunk key.

    Raises:
        InvalidArgumentError: ``field: must be 32 bytes, got N``.
    """
    if len(key) != KEY_BYTES:
        raise InvalidArgumentError(field, f"must be {KEY_BYTES} bytes, got {len(key)}")
    return bytes(key)


def keys_from_proto(keys: Sequence[bytes], field: str = "keys") -> list[bytes]:
    """The chunk keys of a repeated bytes field.

    Raises:
        InvalidArgumentError: ``keys[i]: must be 32 bytes, got N``.
    """
    return [check_key_field(k, f"{field}[{i}]") for i, k in enumerate(keys)]


def ttl_from_proto(ttl_s: float, field: str = "ttl_s") -> float | None:
    """A lease or ticket lifetime: None (the daemon's default) for 0.

    Raises:
        InvalidArgumentError: negative or not finite.
    """
    if not math.isfinite(ttl_s) or ttl_s < 0:
        raise InvalidArgumentError(field, f"must be a finite number of seconds >= 0, got {ttl_s!r}")
    return ttl_s or None


def timeout_from_proto(timeout_s: float, field: str = "timeout_s") -> float:
    """A wait in seconds (0: do not wait).

    Raises:
        InvalidArgumentError: negative or NaN.
    """
    if math.isnan(timeout_s) or timeout_s < 0:
        raise InvalidArgumentError(field, f"must be >= 0 seconds, got {timeout_s!r}")
    return timeout_s


def codec_from_proto(codec: int, field: str = "codec") -> bool:
    """Whether a wire codec is zstd.

    Raises:
        InvalidArgumentError: not a known codec.
    """
    if codec not in _CODECS:
        raise InvalidArgumentError(field, f"{codec} is not a codec; valid: CODEC_RAW, CODEC_ZSTD")
    return bool(codec == pb.CODEC_ZSTD)


def tier_to_proto(level: TierLevel | None) -> pb.Tier:
    """The wire tier (TIER_UNSPECIFIED for None)."""
    return pb.TIER_UNSPECIFIED if level is None else TIERS[level]


def lookup_to_proto(result: LookupResult) -> pb.LookupResponse:
    """A LookupResponse: the contiguous prefix in any tier and per tier."""
    return pb.LookupResponse(
        chunks=result.chunks,
        by_tier=[pb.TierCount(tier=TIERS[lv], chunks=n) for lv, n in sorted(result.by_tier.items())],
    )


def slot_refs(slots: Sequence[StoreSlot] | Sequence[LoadChunk], nbytes: int) -> list[pb.SlotRef]:
    """SlotRefs of a store ticket's slots or a load ticket's chunks (each ``nbytes`` long)."""
    refs = []
    for s in slots:
        assert s.slot is not None, "shared-memory slots always have an index"
        refs.append(pb.SlotRef(index=s.index, slot=s.slot, nbytes=nbytes))
    return refs


def stats_to_proto(stats: CacheStats) -> pb.StatsResponse:
    """A StatsResponse of a stats snapshot."""
    return pb.StatsResponse(
        tiers=[
            pb.TierStats(
                tier=TIERS[t.level],
                chunks=t.chunks,
                used_bytes=t.used_bytes,
                capacity_bytes=t.capacity_bytes,
                hits=t.hits,
                misses=t.misses,
                evictions=t.evictions,
                promotions=t.promotions,
                demotions=t.demotions,
                corrupt_reads=t.corrupt_reads,
            )
            for t in stats.tiers
        ],
        namespaces=stats.namespaces,
        active_leases=stats.active_leases,
        expired_leases=stats.expired_leases,
        single_flight_joins=stats.single_flight_joins,
        pending_writes=stats.pending_writes,
        failed_writes=stats.failed_writes,
    )


def event_to_proto(event: HubEvent) -> pb.CacheEvent:
    """The wire CacheEvent of a hub event."""
    return pb.CacheEvent(
        sequence=event.sequence,
        kind=_EVENT_KINDS[event.kind],
        tier=tier_to_proto(event.level),
        handle=event.handle,
        key=event.key,
        evicted=event.evicted,
    )
