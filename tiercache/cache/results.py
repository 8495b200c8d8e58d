"""Results the cache manager hands out.

Primitives:
    LookupResult: how much of a key chain is cached, per tier.
    StoreSlot, StoreTicket: reserved, invisible space of a two-phase store.
    LoadChunk, LoadTicket: leased chunks of a load.
    Prefetch: background promotions of a chain (futures, cancel, ready).
    Listener: the callback type of :meth:`CacheManager.subscribe`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from tiercache.stats import ChunkEvent
from tiercache.tiers.base import TierLevel

Listener = Callable[[ChunkEvent], None]


@dataclass(frozen=True, slots=True)
class LookupResult:
    """How much of a key chain is cached.

    Attributes:
        chunks: length of the contiguous prefix present in any tier.
        by_tier: per tier, the length of the contiguous prefix present in that tier.
    """

    chunks: int
    by_tier: Mapping[TierLevel, int]


@dataclass(frozen=True, slots=True)
class StoreSlot:
    """One chunk buffer of a store ticket, to be filled by the caller before commit.

    Attributes:
        index: position of the chunk in the key chain given to ``begin_store``.
        key: the chunk key.
        buffer: writable 1-D uint8 tensor of ``chunk_bytes`` bytes (in the tier's memory).
        slot: slot index inside the tier's pool (slot tiers), else None.
    """

    index: int
    key: bytes
    buffer: torch.Tensor
    slot: int | None


@dataclass(frozen=True, slots=True)
class StoreTicket:
    """Reserved, invisible space for new chunks.

    Attributes:
        ticket_id: pass it to ``commit_store`` / ``abort_store``.
        namespace_id: the namespace.
        level: the tier the chunks land in.
        slots: buffers to fill, in chain order.
        skipped: chain positions not reserved because they are cached or being stored by someone else.
        expires_at: manager-clock time after which the reservation is dropped.
    """

    ticket_id: int
    namespace_id: bytes
    level: TierLevel
    slots: tuple[StoreSlot, ...]
    skipped: tuple[int, ...]
    expires_at: float


@dataclass(frozen=True, slots=True)
class LoadChunk:
    """One leased chunk of a load ticket.

    Attributes:
        index: position in the key chain.
        key: the chunk key.
        slot: slot index inside the tier's pool.
        source: the tier the bytes came from: ``level`` itself when the chunk was there, else the fastest
            tier it was promoted from.
        read_view: the tier's view of the chunk (see :attr:`view`).
    """

    index: int
    key: bytes
    slot: int
    source: TierLevel
    read_view: Callable[[], torch.Tensor | None] = field(repr=False, compare=False)

    @property
    def view(self) -> torch.Tensor:
        """Zero-copy read view of the chunk's bytes (valid until the lease ends).

        Made when asked for, not with the lease: a daemon answering AcquireLoad sends slot numbers only,
        and a view per chunk would cost it more than the rest of the lease.

        Raises:
            RuntimeError: the chunk is gone from its tier (asked after the lease ended, or a copy out of the
                tier found it corrupt and dropped it).
        """
        view = self.read_view()
        if view is None:
            raise RuntimeError(
                f"chunk {self.index} of the load is gone from its tier: its lease ended, or it was found corrupt"
                " and dropped"
            )
        return view


@dataclass(frozen=True, slots=True)
class LoadTicket:
    """Chunks of the cached prefix of a chain, leased in one slot tier.

    Attributes:
        lease_id: pass it to ``release``; 0 when nothing was leased.
        namespace_id: the namespace.
        level: the tier holding the leased chunks.
        chunks: the contiguous cached prefix, in chain order.
        expires_at: manager-clock time at which the lease lapses.
    """

    lease_id: int
    namespace_id: bytes
    level: TierLevel
    chunks: tuple[LoadChunk, ...]
    expires_at: float


class Prefetch:
    """Background promotions of the cached prefix of a chain into a slot tier.

    Attributes:
        futures: per chunk of the cached prefix (chain order), True once it is in the tier; False if it
            could not be brought (no room, corrupt, cancelled).
    """

    def __init__(self, futures: list[Future[bool]], cancelled: threading.Event) -> None:
        """Wrap the futures of the promotions (built by :meth:`CacheManager.prefetch`)."""
        self.futures = tuple(futures)
        self._cancelled = cancelled

    def cancel(self) -> int:
        """Drop promotions that have not started (the request went away). Returns how many were dropped."""
        self._cancelled.set()
        return sum(fut.cancel() for fut in self.futures)

    def ready(self) -> int:
        """Length of the prefix already promoted."""
        n = 0
        for fut in self.futures:
            if not fut.done() or fut.cancelled() or fut.exception() is not None or not fut.result():
                break
            n += 1
        return n
