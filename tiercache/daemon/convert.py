"""Conversions between the wire messages of ``tiercache.v1`` and the core's types.

Every conversion from the wire validates what it converts and raises
:class:`~tiercache.errors.InvalidArgumentError` naming the field by its path in the request
(``namespace.layout.dtype``, ``keys[3]``, ``ttl_s``).

Primitives:
    namespace_from_proto, layout_to_proto: NamespaceSpec -> Namespace, KVLayout -> Layout.
    keys_from_proto, check_key_field: 32-byte chunk keys.
    ttl_from_proto, timeout_from_proto: optional durations (0 means the default / no wait).
    codec_from_proto, tier_to_proto, tier_from_proto, load_policy_from_proto: enums.
    prefill_from_proto, deadline_from_proto: the cost models an engine declares at registration.
    usage_from_proto: ReportUsage's per-tier chunks -> tokens per tier.
    lookup_to_proto, slot_refs, claim_to_proto, event_to_proto: responses (stats travel through
        :mod:`tiercache.stats_wire`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import cast

from tiercache.cache import LoadChunk, LookupResult, StoreSlot
from tiercache.errors import InvalidArgumentError
from tiercache.keys import KEY_BYTES, Namespace
from tiercache.layout import KVDtype, KVLayout
from tiercache.policies.load import DeadlineModel, LoadPolicyKind, PrefillModel
from tiercache.prefill import PrefillClaim
from tiercache.proto import tiercache_pb2 as pb
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
_DTYPE_WIRE: dict[KVDtype, pb.KVDtype] = {v: cast(pb.KVDtype, k) for k, v in DTYPES.items()}
TIERS: dict[TierLevel, pb.Tier] = {
    TierLevel.L1: pb.TIER_L1,
    TierLevel.L2: pb.TIER_L2,
    TierLevel.L3: pb.TIER_L3,
}
"""Core tier -> wire tier."""
_TIERS_BACK: dict[int, TierLevel] = {int(v): k for k, v in TIERS.items()}
POLICIES: dict[int, LoadPolicyKind] = {
    pb.LOAD_POLICY_WAIT_COMPLETE: LoadPolicyKind.WAIT_COMPLETE,
    pb.LOAD_POLICY_BEST_EFFORT: LoadPolicyKind.BEST_EFFORT,
    pb.LOAD_POLICY_TIMEOUT: LoadPolicyKind.TIMEOUT,
    pb.LOAD_POLICY_COST_AWARE: LoadPolicyKind.COST_AWARE,
}
"""Wire load policy -> core load policy."""
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


def _finite(value: float, field: str, positive: bool = False) -> float:
    ok = math.isfinite(value) and (value > 0 if positive else value >= 0)
    if not ok:
        want = "> 0" if positive else ">= 0"
        raise InvalidArgumentError(field, f"must be a finite number {want}, got {value!r}")
    return float(value)


def prefill_from_proto(msg: pb.PrefillModel, present: bool, field: str = "prefill") -> PrefillModel | None:
    """The engine's declared prefill model, None when the request did not declare one.

    Raises:
        InvalidArgumentError: ``prefill.tokens_per_s`` not positive, or ``prefill.quadratic_s`` negative.
    """
    if not present:
        return None
    return PrefillModel(
        tokens_per_s=_finite(msg.tokens_per_s, f"{field}.tokens_per_s", positive=True),
        quadratic_s=_finite(msg.quadratic_s, f"{field}.quadratic_s"),
    )


def deadline_from_proto(
    msg: pb.DeadlineModel, present: bool, field: str = "deadline"
) -> DeadlineModel | None:
    """The engine's declared load-deadline model (``cap_s`` 0: no cap), None when not declared.

    Raises:
        InvalidArgumentError: a negative or non-finite term, naming it (``deadline.base_s``).
    """
    if not present:
        return None
    base = _finite(msg.base_s, f"{field}.base_s")
    per_1k = _finite(msg.per_1k_tokens_s, f"{field}.per_1k_tokens_s")
    cap = _finite(msg.cap_s, f"{field}.cap_s")
    return DeadlineModel(base_s=base, per_1k_tokens_s=per_1k, cap_s=cap or float("inf"))


def load_policy_from_proto(value: int, field: str = "policy") -> LoadPolicyKind:
    """The core load policy of a wire value.

    Raises:
        InvalidArgumentError: not a known policy (the message lists the valid ones).
    """
    kind = POLICIES.get(value)
    if kind is None:
        valid = ", ".join(pb.LoadPolicy.Name(v) for v in POLICIES)
        raise InvalidArgumentError(field, f"{value} is not a load policy; valid: {valid}")
    return kind


def tier_from_proto(value: int, field: str = "tier") -> TierLevel:
    """The core tier of a wire tier.

    Raises:
        InvalidArgumentError: TIER_UNSPECIFIED or an unknown value.
    """
    level = _TIERS_BACK.get(int(value))
    if level is None:
        raise InvalidArgumentError(field, f"{value} is not a tier; valid: TIER_L1, TIER_L2, TIER_L3")
    return level


def usage_from_proto(
    counts: Sequence[pb.TierCount], chunk_tokens: int, field: str = "effective_chunks"
) -> Mapping[TierLevel, int]:
    """Tokens per source tier of ReportUsage's chunk counts (a tier named twice is summed).

    Raises:
        InvalidArgumentError: an unknown tier, e.g. ``effective_chunks[1].tier``.
    """
    tokens: dict[TierLevel, int] = {}
    for i, count in enumerate(counts):
        level = tier_from_proto(int(count.tier), f"{field}[{i}].tier")
        tokens[level] = tokens.get(level, 0) + count.chunks * chunk_tokens
    return tokens


def tier_to_proto(level: TierLevel | None) -> pb.Tier:
    """The wire tier (TIER_UNSPECIFIED for None)."""
    return pb.TIER_UNSPECIFIED if level is None else TIERS[level]


def lookup_to_proto(result: LookupResult, prefetch_id: int = 0) -> pb.LookupResponse:
    """A LookupResponse: the contiguous prefix in any tier and per tier (and the prefetch started)."""
    return pb.LookupResponse(
        chunks=result.chunks,
        by_tier=[pb.TierCount(tier=TIERS[lv], chunks=n) for lv, n in sorted(result.by_tier.items())],
        prefetch_id=prefetch_id,
    )


def slot_refs(slots: Sequence[StoreSlot] | Sequence[LoadChunk], nbytes: int) -> list[pb.SlotRef]:
    """SlotRefs of a store ticket's slots or a load ticket's chunks (each ``nbytes`` long; loads: source)."""
    refs = []
    for s in slots:
        assert s.slot is not None, "shared-memory slots always have an index"
        source = TIERS[s.source] if isinstance(s, LoadChunk) else pb.TIER_UNSPECIFIED
        refs.append(pb.SlotRef(index=s.index, slot=s.slot, nbytes=nbytes, source=source))
    return refs


def claim_to_proto(claim: PrefillClaim) -> pb.ClaimPrefillResponse:
    """A ClaimPrefillResponse of a prefill claim."""
    return pb.ClaimPrefillResponse(
        claim_id=claim.claim_id,
        cached=claim.cached,
        wait=claim.wait,
        lead=claim.lead,
        takeovers=claim.takeovers,
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
