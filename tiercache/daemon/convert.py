"""The daemon's request-specific conversions of ``tiercache.v1`` messages; shared values go through
:mod:`tiercache.wire`.

Every conversion from the wire validates what it converts and raises
:class:`~tiercache.errors.InvalidArgumentError` naming the field by its path in the request
(``namespace.layout.dtype``, ``keys[3]``, ``ttl_s``).

Primitives:
    RegisterArgs, register_from_proto: a RegisterRequest's namespace (required) and cost models (optional).
    keys_from_proto, check_key_field: 32-byte chunk keys; lookup_keys: a Lookup's (repeated or packed).
    ttl_from_proto, timeout_from_proto: optional durations (0 means the default / no wait).
    usage_from_proto: ReportUsage's per-tier chunks -> tokens per tier.
    lookup_to_proto, slot_refs, add_load_refs, claim_to_proto, event_to_proto: responses (stats travel
        through :mod:`tiercache.wire.stats`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from tiercache.cache import LoadChunk, LookupResult, StoreSlot
from tiercache.errors import InvalidArgumentError
from tiercache.keychain import PackedKeys
from tiercache.keys import KEY_BYTES, Namespace
from tiercache.policies.load import DeadlineModel, PrefillModel
from tiercache.prefill import PrefillClaim
from tiercache.proto import tiercache_pb2 as pb
from tiercache.tiers.base import TierLevel
from tiercache.wire import TIERS, deadline_from_proto, namespace_from_proto, prefill_from_proto, tier_to_proto

from .events import HubEvent, HubEventKind

_EVENT_KINDS = {
    HubEventKind.STORED: pb.CacheEvent.KIND_STORED,
    HubEventKind.REMOVED: pb.CacheEvent.KIND_REMOVED,
    HubEventKind.CLEARED: pb.CacheEvent.KIND_CLEARED,
    HubEventKind.RESYNC: pb.CacheEvent.KIND_RESYNC,
}


@dataclass(frozen=True, slots=True)
class RegisterArgs:
    """What a RegisterRequest declares.

    Attributes:
        namespace: the engine's namespace.
        prefill: its prefill model, None when it declared none.
        deadline: its load-deadline model, None when it declared none.
    """

    namespace: Namespace
    prefill: PrefillModel | None
    deadline: DeadlineModel | None


def register_from_proto(request: pb.RegisterRequest) -> RegisterArgs:
    """The namespace and cost models of a RegisterRequest.

    Raises:
        InvalidArgumentError: ``namespace: is required``, or naming the bad field of the namespace
            (``namespace.layout.dtype``) or of a cost model (``prefill.tokens_per_s``, ``deadline.base_s``).
    """
    if not request.HasField("namespace"):
        raise InvalidArgumentError("namespace", "is required")
    namespace = namespace_from_proto(request.namespace, "namespace")
    prefill = prefill_from_proto(request.prefill, "prefill") if request.HasField("prefill") else None
    deadline = deadline_from_proto(request.deadline, "deadline") if request.HasField("deadline") else None
    return RegisterArgs(namespace, prefill, deadline)


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
    out = list(keys)  # protobuf's repeated bytes are bytes: only their lengths need a look
    if set(map(len, out)) <= {KEY_BYTES}:
        return out  # the usual case, checked in bulk (a 512-key lookup pays no Python call per key)
    return [check_key_field(k, f"{field}[{i}]") for i, k in enumerate(out)]


def lookup_keys(request: pb.LookupRequest) -> Sequence[bytes]:
    """The key chain of a LookupRequest: its ``packed_keys`` (kept packed: :mod:`tiercache.keychain`), else
    its repeated ``keys``.

    Raises:
        InvalidArgumentError: both are set (``packed_keys``), ``packed_keys`` is not a whole number of keys,
            or ``keys[i]`` is not a key.
    """
    if not request.packed_keys:
        return keys_from_proto(request.keys)
    if request.keys:
        raise InvalidArgumentError("packed_keys", "a request sets keys or packed_keys, not both")
    return PackedKeys(request.packed_keys)


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


def usage_from_proto(
    counts: Sequence[pb.TierCount], chunk_tokens: int, field: str = "effective_chunks"
) -> Mapping[TierLevel, int]:
    """Tokens per source tier of ReportUsage's chunk counts (a tier named twice is summed).

    Raises:
        InvalidArgumentError: an unknown tier, e.g. ``effective_chunks[1].tier``.
    """
    tokens: dict[TierLevel, int] = {}
    for i, count in enumerate(counts):
        level = TIERS.from_proto(int(count.tier), f"{field}[{i}].tier")
        tokens[level] = tokens.get(level, 0) + count.chunks * chunk_tokens
    return tokens


def tokens_from_proto(
    counts: Sequence[pb.TierTokens], field: str, into: Mapping[TierLevel, int] | None = None
) -> Mapping[TierLevel, int]:
    """Tokens per tier of a usage report's token counts (a tier named twice is summed), added to ``into``.

    Raises:
        InvalidArgumentError: an unknown tier, e.g. ``loaded_tokens[1].tier``.
    """
    tokens = dict(into or {})
    for i, count in enumerate(counts):
        level = TIERS.from_proto(int(count.tier), f"{field}[{i}].tier")
        tokens[level] = tokens.get(level, 0) + int(count.tokens)
    return tokens


@dataclass(frozen=True, slots=True)
class Usage:
    """A usage report (ReportUsageRequest's or a Settlement's fields), in tokens per source tier.

    Attributes:
        effective: tokens whose prefill the engine skipped (whole chunks and token counts together).
        loaded: tokens the engine copied out of the cache intact and in time.
        recomputed_tokens: looked-up tokens the engine computed anyway.
        read_keys: chunks the engine read out of L2 through the published index (no lease).
    """

    effective: Mapping[TierLevel, int]
    loaded: Mapping[TierLevel, int]
    recomputed_tokens: int
    read_keys: Sequence[bytes] = ()

    @property
    def empty(self) -> bool:
        """Nothing to count."""
        return (
            not self.recomputed_tokens
            and not any(self.effective.values())
            and not any(self.loaded.values())
            and not self.read_keys
        )


def usage_report_from_proto(
    msg: pb.ReportUsageRequest | pb.Settlement, chunk_tokens: int, prefix: str = ""
) -> Usage:
    """The usage a ReportUsageRequest or a Settlement carries (``prefix`` names the message in errors, e.g.
    ``settle.``).

    Raises:
        InvalidArgumentError: an unknown tier (naming its field, e.g. ``settle.loaded_tokens[0].tier``), or
            ``read_keys`` not a whole number of keys.
    """
    effective = usage_from_proto(msg.effective_chunks, chunk_tokens, f"{prefix}effective_chunks")
    effective = tokens_from_proto(msg.effective_tokens, f"{prefix}effective_tokens", effective)
    loaded = tokens_from_proto(msg.loaded_tokens, f"{prefix}loaded_tokens")
    read = PackedKeys(msg.read_keys, f"{prefix}read_keys") if msg.read_keys else ()
    return Usage(effective, loaded, int(msg.recomputed_tokens), read)


def lookup_to_proto(result: LookupResult, prefetch_id: int = 0) -> pb.LookupResponse:
    """A LookupResponse: the contiguous prefix in any tier and per tier (and the prefetch started).

    Filled in place, like :func:`add_load_refs` (~2.5 us against ~3.6 us with TierCounts built apart).
    """
    response = pb.LookupResponse(chunks=result.chunks, prefetch_id=prefetch_id)
    add = response.by_tier.add
    for level, chunks in sorted(result.by_tier.items()):
        add(tier=TIERS.to_proto(level), chunks=chunks)
    return response


def add_store_refs(
    refs: RepeatedCompositeFieldContainer[pb.SlotRef], slots: Sequence[StoreSlot], nbytes: int
) -> None:
    """Append a store ticket's slots to a response's ``slots`` (each ``nbytes`` long; filled in place, as
    :func:`add_load_refs`: building each SlotRef apart was half of a 256-chunk BeginStore in the daemon)."""
    add = refs.add
    for s in slots:
        assert s.slot is not None, "shared-memory slots always have an index"
        add(index=s.index, slot=s.slot, nbytes=nbytes)


def add_load_refs(
    refs: RepeatedCompositeFieldContainer[pb.SlotRef], chunks: Sequence[LoadChunk], nbytes: int
) -> None:
    """Append a load ticket's chunks to a response's ``slots`` (each ``nbytes`` long, with its source).

    Filled in place: building each SlotRef apart and letting the response copy them took ~3x the time
    (~0.1 ms of a 32-chunk AcquireLoad on these machines).
    """
    add = refs.add
    sources: dict[TierLevel, int] = {}
    for c in chunks:
        source = sources.get(c.source)
        if source is None:
            source = sources[c.source] = TIERS.to_proto(c.source)
        add(index=c.index, slot=c.slot, nbytes=nbytes, source=source)


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
        epoch=event.epoch,
        source=tier_to_proto(event.source),
    )
