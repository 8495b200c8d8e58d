"""Put/get measurement of one tier, and round-trip verification.

``put`` is the tier's two-phase write as the cache manager's moves do it: ``reserve`` a batch, then
``commit_from`` the payload chunks: each is copied into its ``slot.buffer`` and committed, except by a tier
that sends bytes on from where they are (the shared tier writes the payload to the store without a copy,
as it does when L2 writes a chunk down to it). ``get`` is ``read_into`` a preallocated destination. Both run
``batch`` chunks per call; a latency is one call's. Warm-up rounds (put, get, delete, untimed) come first so
that first-touch page faults and LMDB's first page allocations are not timed. After the timed get every
chunk read back is compared with its source: a mismatch or a miss is an error, never a figure.

Primitives:
    Op: put or get.
    TierOptions: how tiers are built and driven (L1 device, L3 codec and durability, batch, warm-up).
    TierOpResult: one tier's figure for one op at one chunk size.
    RoundTripError: bytes read back differ from the bytes written, or a chunk that was put is missing.
    verify_round_trip: compare read-back chunks with their sources.
    tier_device: where a tier's payloads and destinations live.
    open_tier: build a tier sized for one round (an Enum-keyed registry of factories).
    measure_tier: time put then get of a payload through a tier, and verify what came back.
"""

from __future__ import annotations

import enum
import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from tiercache.codec import Codec
from tiercache.keys import NAMESPACE_ID_BYTES, chunk_id
from tiercache.tiers.base import StorageTier, TierLevel
from tiercache.tiers.hbm import HbmTier, HbmTierConfig
from tiercache.tiers.host import HostTier, HostTierConfig
from tiercache.tiers.lmdb import LmdbTier, LmdbTierConfig
from tiercache.tiers.shared import SharedTier, SharedTierConfig

from .payload import Payload, batch_ranges
from .timing import Timing, time_calls

logger = logging.getLogger(__name__)

_L3_SLACK_PER_CHUNK_BYTES = 4096
_L3_SLACK_BYTES = 1 << 20
_BENCH_NAMESPACE_ID = hashlib.blake2b(b"tiercache-bench", digest_size=NAMESPACE_ID_BYTES).digest()


class Op(enum.Enum):
    """A measured tier operation. The value is its name in the table and the JSON."""

    PUT = "put"
    GET = "get"


@dataclass(frozen=True, slots=True)
class TierOptions:
    """How tiers are built and driven.

    Attributes:
        l1_device: torch device of the L1 pool (``cpu`` or ``cuda[:n]``).
        codec: L3 payload codec.
        zstd_level: L3 zstd level (with ``Codec.ZSTD``).
        durable: L3 fsyncs every commit.
        batch: chunks per put/get call.
        warmup_rounds: untimed put/get/delete rounds before the timed one.
        shm_prefix: L2 shared-memory segment prefix (distinct from a daemon's).
        shared_url: the shared tier's store (a Redis Cluster / server seed URL); set by the run.
        shared_codec: the shared tier's payload codec.
    """

    l1_device: str = "cpu"
    codec: Codec = Codec.RAW
    zstd_level: int = 3
    durable: bool = False
    batch: int = 8
    warmup_rounds: int = 1
    shm_prefix: str = "tiercache-bench-l2"
    shared_url: str = ""
    shared_codec: Codec = Codec.RAW


@dataclass(frozen=True, slots=True)
class TierOpResult:
    """One tier's figure for one op at one chunk size.

    Attributes:
        level: the tier.
        op: put or get.
        device: device of the tier's payloads and destinations.
        chunk_bytes: bytes per chunk.
        timing: throughput and per-call (per-batch) latency.
        verified_bytes: bytes compared equal to their source after the round (the same for put and get:
            the round trip verifies both).
    """

    level: TierLevel
    op: Op
    device: str
    chunk_bytes: int
    timing: Timing
    verified_bytes: int


class RoundTripError(Exception):
    """Bytes read back from a tier differ from what was put, or a chunk that was put is missing."""


def verify_round_trip(sources: Sequence[torch.Tensor], readbacks: Sequence[torch.Tensor]) -> int:
    """Compare each read-back chunk with its source, byte for byte.

    Args:
        sources: chunks as written (1-D uint8).
        readbacks: chunks as read back, in the same order (same device as their source; a longer buffer is
            compared on its first ``len(source)`` bytes).

    Returns:
        Bytes verified (the sum of the sources' sizes).

    Raises:
        RoundTripError: the counts differ, a read-back is too short, or a chunk differs (the message names
            the chunk and its first differing byte).
    """
    if len(sources) != len(readbacks):
        raise RoundTripError(f"{len(readbacks)} chunks read back for {len(sources)} written")
    verified = 0
    for i, (src, got) in enumerate(zip(sources, readbacks, strict=True)):
        n = src.numel()
        if got.numel() < n:
            raise RoundTripError(f"chunk {i}: read back {got.numel()} bytes, wrote {n}")
        head = got[:n]
        if not torch.equal(head, src):
            first = int(torch.nonzero(head != src)[0, 0])
            raise RoundTripError(
                f"chunk {i} of {n} bytes differs from its source, first at byte {first} "
                f"(wrote {int(src[first])}, read {int(head[first])})"
            )
        verified += n
    return verified


def tier_device(level: TierLevel, options: TierOptions) -> torch.device:
    """Device of a tier's payloads and destinations: L1's device for L1, the CPU for L2 and L3."""
    return torch.device(options.l1_device) if level is TierLevel.L1 else torch.device("cpu")


def _open_l1(options: TierOptions, chunk_bytes: int, num_chunks: int, directory: Path) -> StorageTier:
    return HbmTier(HbmTierConfig(num_chunks * chunk_bytes, chunk_bytes, options.l1_device))


def _open_l2(options: TierOptions, chunk_bytes: int, num_chunks: int, directory: Path) -> StorageTier:
    return HostTier(HostTierConfig(num_chunks * chunk_bytes, chunk_bytes, segment_prefix=options.shm_prefix))


def _open_l3(options: TierOptions, chunk_bytes: int, num_chunks: int, directory: Path) -> StorageTier:
    capacity = num_chunks * (chunk_bytes + _L3_SLACK_PER_CHUNK_BYTES) + _L3_SLACK_BYTES
    config = LmdbTierConfig(
        path=str(directory),
        capacity_bytes=capacity,
        codec=options.codec,
        zstd_level=options.zstd_level,
        durable=options.durable,
    )
    return LmdbTier(config)


def _open_shared(options: TierOptions, chunk_bytes: int, num_chunks: int, directory: Path) -> StorageTier:
    prefix = f"tiercache-bench-{directory.name}:"
    return SharedTier(SharedTierConfig(url=options.shared_url, codec=options.shared_codec, key_prefix=prefix))


_TierFactory = Callable[[TierOptions, int, int, Path], StorageTier]
_FACTORIES: Mapping[TierLevel, _TierFactory] = {
    TierLevel.L1: _open_l1,
    TierLevel.L2: _open_l2,
    TierLevel.L3: _open_l3,
    TierLevel.SHARED: _open_shared,
}


def open_tier(
    level: TierLevel, options: TierOptions, chunk_bytes: int, num_chunks: int, directory: Path
) -> StorageTier:
    """Build a tier that holds exactly one round: ``num_chunks`` chunks of ``chunk_bytes`` (L3: plus slack).

    Args:
        level: which tier.
        options: how to build it.
        chunk_bytes: bytes per chunk (the slot size of L1 and L2).
        num_chunks: chunks per round.
        directory: L3's LMDB directory (ignored by L1 and L2); it should be empty.

    Returns:
        The open tier; the caller closes it.
    """
    return _FACTORIES[level](options, chunk_bytes, num_chunks, directory)


def _chunk_ids(chunk_bytes: int, count: int) -> list[bytes]:
    ids = []
    for i in range(count):
        key = hashlib.blake2b(f"{chunk_bytes}:{i}".encode(), digest_size=32).digest()
        ids.append(chunk_id(_BENCH_NAMESPACE_ID, key))
    return ids


def _put(tier: StorageTier, ids: Sequence[bytes], chunks: Sequence[torch.Tensor]) -> None:
    slots = tier.reserve(ids, [c.numel() for c in chunks])
    try:
        tier.commit_from(slots, chunks)
    except BaseException:
        tier.abort(slots)
        raise


def _get(tier: StorageTier, ids: Sequence[bytes], dsts: Sequence[torch.Tensor]) -> None:
    found = tier.read_into(ids, dsts)
    if not all(found):
        missing = ", ".join(cid.hex()[:16] for cid, ok in zip(ids, found, strict=True) if not ok)
        raise RoundTripError(f"{tier.level.name}: chunks put in this round were not found: {missing}")


def measure_tier(
    tier: StorageTier, payload: Payload, dsts: torch.Tensor, options: TierOptions
) -> tuple[TierOpResult, TierOpResult]:
    """Time put then get of every payload chunk through ``tier`` and verify the bytes read back.

    Args:
        tier: an empty tier that holds at least the whole payload.
        payload: the chunks to put, on the tier's device (see :func:`tier_device`).
        dsts: ``[num_chunks, chunk_bytes]`` uint8 destinations on the same device; overwritten.
        options: batch size and warm-up rounds.

    Returns:
        ``(put, get)`` results.

    Raises:
        RoundTripError: a chunk was missing or its bytes differ from the payload.
    """
    device = payload.device
    srcs = payload.chunks()
    outs = list(dsts.unbind(0))
    ids = _chunk_ids(payload.chunk_bytes, payload.num_chunks)
    ranges = batch_ranges(payload.num_chunks, options.batch)
    puts = [partial(_put, tier, ids[r.start : r.stop], srcs[r.start : r.stop]) for r in ranges]
    gets = [partial(_get, tier, ids[r.start : r.stop], outs[r.start : r.stop]) for r in ranges]
    for _ in range(options.warmup_rounds):
        for call in (*puts, *gets):
            call()
        tier.delete(ids)
    put = time_calls(puts, payload.total_bytes, device)
    dsts.zero_()
    get = time_calls(gets, payload.total_bytes, device)
    verified = verify_round_trip(srcs, outs)
    return (
        TierOpResult(tier.level, Op.PUT, str(device), payload.chunk_bytes, put, verified),
        TierOpResult(tier.level, Op.GET, str(device), payload.chunk_bytes, get, verified),
    )
