"""The cache manager: the index of which chunk lives in which tier, and the only code that moves chunks
between tiers.

Chunks are filed by ``(namespace id, chunk key)``. A namespace must be registered before use. Stores are
two-phase (begin -> the caller fills the buffers -> commit or abort); loads lease the chunks in a slot tier
(promoting them from slower tiers first) so that they cannot be evicted while the caller copies them.
Leases and store tickets have a TTL: a caller that dies cannot hold space forever.

Eviction runs when a tier needs room: the eviction policy ranks the evictable chunks (not leased, not
pinned, older than the minimum residency); the write policy decides whether a victim that no slower tier
holds is demoted or dropped. Write-downs decided at commit or on hits run on a background thread.

Reads of a slower tier (L3 I/O) and promotions run outside the manager's lock and are single-flight:
concurrent readers of one chunk share one read.

Primitives:
    CacheConfig: policies, minimum residency, lease TTL.
    CacheManager: register_namespace, lookup, begin_store / commit_store / abort_store, put, acquire /
        release, get, promote, demote, pin / unpin, purge, subscribe, stats, flush, close.
    LookupResult, StoreTicket, StoreSlot, LoadTicket, LoadChunk: results.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType

import torch

from tiercache.errors import CapacityError, ConflictError, InvalidArgumentError, NotFoundError
from tiercache.keys import Namespace, check_key, chunk_id, split_chunk_id
from tiercache.layout import KVLayout
from tiercache.policies import (
    Candidate,
    EvictionPolicyKind,
    WritePolicyKind,
    make_eviction_policy,
    make_write_policy,
)
from tiercache.policies.load import CostPlan, PrefillModel, plan_cost_aware
from tiercache.prefill import PrefillClaim, PrefillCoordinator
from tiercache.rates import RateEstimator, TierRate
from tiercache.singleflight import SingleFlight
from tiercache.stats import CacheStats, ChunkEvent, EventKind, TierStats
from tiercache.tiers.base import SlotTier, StorageTier, TierLevel, WriteSlot

logger = logging.getLogger(__name__)

Listener = Callable[[ChunkEvent], None]


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """Policies and timing of the cache manager.

    Attributes:
        write_policy: when chunks are written down to slower tiers.
        eviction_policy: which evictable chunk goes first.
        selective_min_hits: reads after which the selective policy writes a chunk down.
        min_residency_s: a newly stored chunk is not evicted from a tier before this many seconds.
        lease_ttl_s: default lifetime of a load lease or store ticket.
        prefetch_workers: threads running background promotions.
        prefetch_inflight_bytes: bound on the bytes of promotions in flight at once, so that prefetching
            cannot take every free slot from stores.
    """

    write_policy: WritePolicyKind = WritePolicyKind.WRITE_THROUGH
    eviction_policy: EvictionPolicyKind = EvictionPolicyKind.LRU
    selective_min_hits: int = 2
    min_residency_s: float = 0.0
    lease_ttl_s: float = 30.0
    prefetch_workers: int = 4
    prefetch_inflight_bytes: int = 256 << 20

    def __post_init__(self) -> None:
        for name in ("prefetch_workers", "prefetch_inflight_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InvalidArgumentError(name, f"must be a positive integer, got {value!r}")
        if not isinstance(self.write_policy, WritePolicyKind):
            raise InvalidArgumentError(
                "write_policy", f"must be a WritePolicyKind, got {self.write_policy!r}"
            )
        if not isinstance(self.eviction_policy, EvictionPolicyKind):
            raise InvalidArgumentError(
                "eviction_policy", f"must be an EvictionPolicyKind, got {self.eviction_policy!r}"
            )
        if not self.min_residency_s >= 0:
            raise InvalidArgumentError("min_residency_s", f"must be >= 0, got {self.min_residency_s!r}")
        if not self.lease_ttl_s > 0:
            raise InvalidArgumentError("lease_ttl_s", f"must be > 0, got {self.lease_ttl_s!r}")


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
        view: zero-copy read view of the chunk's bytes (valid until the lease ends).
        source: the tier the bytes came from: ``level`` itself when the chunk was there, else the fastest
            tier it was promoted from.
    """

    index: int
    key: bytes
    slot: int
    view: torch.Tensor
    source: TierLevel


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


class _ByteBudget:
    """Bounds the bytes of promotions in flight; one oversized promotion may run alone."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._used = 0
        self._cond = threading.Condition()

    def acquire(self, nbytes: int) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._used == 0 or self._used + nbytes <= self._limit)
            self._used += nbytes

    def release(self, nbytes: int) -> None:
        with self._cond:
            self._used -= nbytes
            self._cond.notify_all()


@dataclass(slots=True)
class _Residency:
    last_access: int
    stored_at: float
    leases: int = 0


@dataclass(slots=True)
class _Chunk:
    namespace_id: bytes
    key: bytes
    depth: int
    nbytes: int
    res: dict[TierLevel, _Residency] = field(default_factory=dict)
    hits: int = 0
    pinned: bool = False
    purged: bool = False  # invisible; its leased copies go when their leases end


@dataclass(slots=True)
class _Counters:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    promotions: int = 0
    demotions: int = 0


@dataclass(slots=True)
class _TokenCounters:
    lookup_hit: int = 0
    load_success: int = 0
    effective_hit: int = 0


@dataclass(slots=True)
class _Lease:
    level: TierLevel
    chunk_ids: list[bytes]
    expires_at: float


@dataclass(slots=True)
class _Store:
    namespace_id: bytes
    level: TierLevel
    writes: list[WriteSlot]
    depths: list[int]
    indices: list[int]
    expires_at: float


def _wait_until(future: Future[bool], deadline: float) -> bool:
    """A promotion's result if it arrives before ``deadline`` (``time.monotonic``), else False."""
    remaining = deadline - time.monotonic()
    if remaining <= 0 and not future.done():
        return False
    try:
        return future.result(timeout=max(0.0, remaining))
    except (FutureTimeout, CancelledError):
        return False


class CacheManager:
    """Index, policies and data movement over an ordered set of tiers. Thread-safe."""

    def __init__(
        self,
        tiers: Sequence[StorageTier],
        config: CacheConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Take ownership of the tiers and rebuild the index from the persistent ones (warm restart).

        Args:
            tiers: one to three tiers with distinct levels, any order.
            config: policies and timing; defaults when None.
            clock: monotonic seconds; leases, tickets and minimum residency are measured with it.

        Raises:
            InvalidArgumentError: no tiers, or two tiers of one level.
        """
        if not tiers:
            raise InvalidArgumentError("tiers", "at least one tier is needed")
        levels = [t.level for t in tiers]
        if len(set(levels)) != len(levels):
            raise InvalidArgumentError("tiers", f"duplicate tier levels {sorted(levels)}")
        self._config = config or CacheConfig()
        self._clock = clock
        self._tiers: dict[TierLevel, StorageTier] = {t.level: t for t in sorted(tiers, key=lambda t: t.level)}
        self._levels = list(self._tiers)
        self._eviction = make_eviction_policy(self._config.eviction_policy)
        self._writes = make_write_policy(self._config.write_policy, self._config.selective_min_hits)
        self._lock = threading.RLock()
        self._index: dict[bytes, _Chunk] = {}
        self._order: dict[TierLevel, OrderedDict[bytes, None]] = {lv: OrderedDict() for lv in self._levels}
        self._counters = {lv: _Counters() for lv in self._levels}
        self._namespaces: dict[bytes, Namespace] = {}
        self._pinned_namespaces: set[bytes] = set()
        self._leases: dict[int, _Lease] = {}
        self._stores: dict[int, _Store] = {}
        self._storing: set[bytes] = set()
        self._copying: set[tuple[bytes, TierLevel]] = set()
        self._next_id = 1
        self._tick = 0
        self._expired_leases = 0
        self._failed_writes = 0
        self._listeners: list[Listener] = []
        self._promotions: SingleFlight[bool] = SingleFlight()
        self._reads: SingleFlight[torch.Tensor | None] = SingleFlight()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tiercache-writedown")
        self._pending: set[Future[None]] = set()
        self._prefill = PrefillCoordinator(clock)
        self._rates = RateEstimator()
        self._prefetcher = ThreadPoolExecutor(
            max_workers=self._config.prefetch_workers, thread_name_prefix="tiercache-prefetch"
        )
        self._prefetch_budget = _ByteBudget(self._config.prefetch_inflight_bytes)
        self._tokens = {lv: _TokenCounters() for lv in self._levels}
        self._recomputed_tokens = 0
        self._closed = False
        self._rebuild()

    # ------------------------------------------------------------------ registration and lookup

    def register_namespace(self, namespace: Namespace, tenant: str = "") -> bytes:
        """Register a namespace for a tenant (idempotent) and return its id.

        Args:
            namespace: the namespace.
            tenant: the authenticated tenant; each tenant's chunks are filed under an id of its own.

        Raises:
            InvalidArgumentError: its chunks do not fit the tiers (``layout`` names the problem).
        """
        if not isinstance(namespace, Namespace):
            raise InvalidArgumentError("namespace", f"must be a Namespace, got {type(namespace).__name__}")
        nbytes = namespace.layout.chunk_bytes
        for level, tier in self._tiers.items():
            try:
                charge = tier.charge(nbytes)
            except InvalidArgumentError as exc:
                raise InvalidArgumentError(
                    "layout", f"chunks of {nbytes} bytes do not fit {level.name}: {exc}"
                ) from None
            if charge > tier.usage().capacity_bytes:
                raise InvalidArgumentError(
                    "layout", f"a chunk of {nbytes} bytes exceeds {level.name}'s capacity"
                )
        if not isinstance(tenant, str):
            raise InvalidArgumentError("tenant", f"must be a string, got {type(tenant).__name__}")
        ns_id = namespace.scoped_id(tenant)
        with self._lock:
            self._check_open()
            if ns_id not in self._namespaces:
                self._namespaces[ns_id] = namespace
                logger.info(
                    "registered namespace %s (%s@%s)", ns_id.hex(), namespace.model_id, namespace.revision
                )
        return ns_id

    @property
    def levels(self) -> tuple[TierLevel, ...]:
        """The tiers of this cache, fastest first."""
        return tuple(self._levels)

    def namespace(self, namespace_id: bytes) -> Namespace:
        """The registered namespace of an id.

        Raises:
            NotFoundError: not registered.
        """
        with self._lock:
            ns = self._namespaces.get(namespace_id)
        if ns is None:
            raise NotFoundError("namespace_id", f"namespace {bytes(namespace_id).hex()} is not registered")
        return ns

    def lookup(self, namespace_id: bytes, keys: Sequence[bytes], count: bool = False) -> LookupResult:
        """Per tier, and over all tiers, the length of the contiguous cached prefix of ``keys``.

        Args:
            namespace_id: a registered namespace.
            keys: the key chain.
            count: count the hit in the token-weighted lookup statistics (an engine's request; internal
                and diagnostic lookups leave the counters alone).

        Raises:
            NotFoundError: unknown namespace.
            InvalidArgumentError: a malformed key.
        """
        cids = self._chunk_ids(namespace_id, keys)
        by_tier = dict.fromkeys(self._levels, 0)
        with self._lock:
            for level in self._levels:
                n = 0
                for cid in cids:
                    entry = self._index.get(cid)
                    if entry is None or entry.purged or level not in entry.res:
                        break
                    n += 1
                by_tier[level] = n
            cached = self._cached_entries(cids)
            if count:
                chunk_tokens = self._namespaces[namespace_id].layout.chunk_tokens
                for entry in cached:
                    self._tokens[min(entry.res)].lookup_hit += chunk_tokens
        return LookupResult(len(cached), MappingProxyType(by_tier))

    # ------------------------------------------------------------------ stores

    def begin_store(
        self,
        namespace_id: bytes,
        keys: Sequence[bytes],
        level: TierLevel | None = None,
        ttl_s: float | None = None,
        start_depth: int = 0,
    ) -> StoreTicket:
        """Reserve invisible space for the chunks of ``keys`` not cached yet.

        Chunks already cached, or being stored under another ticket, are skipped. The chunks land in
        ``level`` (default: the fastest tier), or in the next slower tier when that one has no room.

        Args:
            namespace_id: a registered namespace.
            keys: the key chain (or a part of it starting at ``start_depth``).
            level: the tier to store into.
            ttl_s: the reservation lapses (is aborted) after this many seconds; default the config's TTL.
            start_depth: chain position of ``keys[0]``.

        Raises:
            NotFoundError: unknown namespace.
            InvalidArgumentError: malformed or duplicate keys, a bad level, TTL or depth.
            CapacityError: no tier at or below ``level`` can make room.
        """
        layout = self._layout(namespace_id)
        cids = self._chunk_ids(namespace_id, keys)
        if len(set(cids)) != len(cids):
            raise InvalidArgumentError("keys", "a key appears twice in one chain")
        if isinstance(start_depth, bool) or not isinstance(start_depth, int) or start_depth < 0:
            raise InvalidArgumentError("start_depth", f"must be a non-negative integer, got {start_depth!r}")
        target = self._level(level)
        ttl = self._ttl(ttl_s)
        with self._lock:
            self._check_open()
            self._tick += 1
            now = self._clock()
            self._reap(now)
            todo = [i for i, cid in enumerate(cids) if not self._known(cid)]
            skipped = tuple(i for i in range(len(cids)) if i not in set(todo))
            ticket_id = self._new_id()
            writes: list[WriteSlot] = []
            landed = target
            if todo:
                sizes = [layout.chunk_bytes] * len(todo)
                writes, landed = self._reserve_from(target, [cids[i] for i in todo], sizes)
            slots = tuple(StoreSlot(i, bytes(keys[i]), ws.buffer, ws.slot) for i, ws in zip(todo, writes))
            self._stores[ticket_id] = _Store(
                namespace_id, landed, writes, [start_depth + i for i in todo], list(todo), now + ttl
            )
            self._storing.update(ws.chunk_id for ws in writes)
            return StoreTicket(ticket_id, namespace_id, landed, slots, skipped, now + ttl)

    def commit_store(self, ticket_id: int, indices: Sequence[int] | None = None) -> int:
        """Make a ticket's chunks visible and apply the write policy. Returns how many chunks it added.

        Args:
            ticket_id: the ticket.
            indices: chain positions (``StoreSlot.index``) to publish now; the ticket stays open for the rest
                (incremental publication during a prefill). None: all that are left, closing the ticket.

        Raises:
            NotFoundError: unknown, finished or expired ticket.
            InvalidArgumentError: an index that is not an open slot of the ticket.
        """
        with self._lock:
            self._check_open()
            self._tick += 1
            now = self._clock()
            self._reap(now)
            store = self._stores.get(ticket_id)
            if store is None:
                raise NotFoundError("ticket_id", f"store ticket {ticket_id} is unknown, finished or expired")
            if indices is None:
                chosen = list(range(len(store.writes)))
            else:
                position = {index: i for i, index in enumerate(store.indices)}
                unknown = [i for i in indices if i not in position]
                if unknown:
                    raise InvalidArgumentError(
                        "indices", f"{unknown} are not open slots of ticket {ticket_id}"
                    )
                chosen = sorted({position[i] for i in indices})
            writes = [store.writes[i] for i in chosen]
            depths = [store.depths[i] for i in chosen]
            self._tiers[store.level].commit(writes)
            keep = [i for i in range(len(store.writes)) if i not in set(chosen)]
            store.writes = [store.writes[i] for i in keep]
            store.depths = [store.depths[i] for i in keep]
            store.indices = [store.indices[i] for i in keep]
            if not store.writes:
                del self._stores[ticket_id]
            self._storing.difference_update(ws.chunk_id for ws in writes)
            for ws, depth in zip(writes, depths):
                _, key = split_chunk_id(ws.chunk_id)
                entry = _Chunk(store.namespace_id, key, depth, ws.nbytes)
                self._index[ws.chunk_id] = entry
                self._add_residency(ws.chunk_id, entry, store.level, now)
                if self._writes.on_commit(self._is_pinned(entry)):
                    self._schedule_write_down(ws.chunk_id)
            self._prefill.published([ws.chunk_id for ws in writes])
            return len(writes)

    def abort_store(self, ticket_id: int) -> bool:
        """Discard a ticket's reservations. Returns False when the ticket was unknown or already finished."""
        with self._lock:
            store = self._stores.pop(ticket_id, None)
            if store is None:
                return False
            self._storing.difference_update(ws.chunk_id for ws in store.writes)
            self._tiers[store.level].abort(store.writes)
            return True

    def put(
        self,
        namespace_id: bytes,
        keys: Sequence[bytes],
        payloads: Sequence[torch.Tensor],
        start_depth: int = 0,
    ) -> int:
        """Store whole chunks by copy (begin, copy, commit). Returns how many chunks were added.

        Raises:
            InvalidArgumentError: payloads and keys differ in number, or a payload has the wrong size.
            (and what ``begin_store`` raises)
        """
        layout = self._layout(namespace_id)
        if len(payloads) != len(keys):
            raise InvalidArgumentError("payloads", f"{len(payloads)} payloads for {len(keys)} keys")
        for i, payload in enumerate(payloads):
            layout.check_buffer(payload, field=f"payloads[{i}]")
        ticket = self.begin_store(namespace_id, keys, start_depth=start_depth)
        try:
            for slot in ticket.slots:
                slot.buffer.copy_(payloads[slot.index])
        except BaseException:
            self.abort_store(ticket.ticket_id)
            raise
        return self.commit_store(ticket.ticket_id)

    # ------------------------------------------------------------------ loads

    def acquire(
        self,
        namespace_id: bytes,
        keys: Sequence[bytes],
        level: TierLevel | None = None,
        ttl_s: float | None = None,
        wait_s: float | None = None,
    ) -> LoadTicket:
        """Lease the contiguous cached prefix of ``keys`` in a slot tier, promoting chunks into it first.

        The prefix ends at the first chunk that is not cached, or that cannot be brought into ``level``
        (no room, its only copy turned out corrupt, or not in time).

        Args:
            namespace_id: a registered namespace.
            keys: the key chain.
            level: a slot tier (L1 or L2); default the fastest one.
            ttl_s: lease lifetime; default the config's TTL.
            wait_s: how long promotion may be waited for: None for as long as it takes, 0 for not at all
                (only chunks already in ``level``), else a deadline from now; promotions still running at
                the deadline go on in the background.

        Raises:
            NotFoundError: unknown namespace.
            InvalidArgumentError: malformed key, bad TTL or wait, or ``level`` is not a slot tier.
        """
        cids = self._chunk_ids(namespace_id, keys)
        target = self._slot_level(level)
        ttl = self._ttl(ttl_s)
        if wait_s is not None and (
            isinstance(wait_s, bool) or not isinstance(wait_s, (int, float)) or wait_s < 0
        ):
            raise InvalidArgumentError("wait_s", f"must be None or a non-negative number, got {wait_s!r}")
        tier = self._tiers[target]
        assert isinstance(tier, SlotTier)
        deadline = time.monotonic() + wait_s if wait_s else 0.0
        background = self.prefetch(namespace_id, keys, target) if wait_s else None
        with self._lock:
            self._check_open()
            self._tick += 1
            now = self._clock()
            self._reap(now)
            lease = _Lease(target, [], now + ttl)
            lease_id = self._new_id()
            self._leases[lease_id] = lease
        chunks: list[LoadChunk] = []
        try:
            for i, cid in enumerate(cids):
                bring: Callable[[], bool] | None
                if wait_s is None:
                    bring = partial(self._ensure_in, cid, target)
                elif background is not None and i < len(background.futures):
                    bring = partial(_wait_until, background.futures[i], deadline)
                else:
                    bring = None
                source = self._lease_one(cid, target, lease, bring)
                if source is None:
                    break
                with self._lock:
                    slot, view = tier.slot_of(cid), tier.view(cid)
                assert slot is not None and view is not None
                chunks.append(LoadChunk(i, bytes(keys[i]), slot, view, source))
        except BaseException:
            self.release(lease_id)
            raise
        if not chunks:
            self.release(lease_id)
            lease_id = 0
        else:
            with self._lock:
                chunk_tokens = self._namespaces[namespace_id].layout.chunk_tokens
                for ch in chunks:
                    self._tokens[ch.source].load_success += chunk_tokens
        return LoadTicket(lease_id, namespace_id, target, tuple(chunks), lease.expires_at)

    def prefetch(
        self, namespace_id: bytes, keys: Sequence[bytes], level: TierLevel | None = None
    ) -> Prefetch:
        """Start promoting the cached prefix of ``keys`` into a slot tier in the background.

        Promotions of one chunk coalesce with any other in flight (one read), and the bytes in flight are
        bounded by ``prefetch_inflight_bytes``.

        Raises:
            NotFoundError: unknown namespace.
            InvalidArgumentError: malformed key, or ``level`` is not a slot tier.
        """
        cids = self._chunk_ids(namespace_id, keys)
        target = self._slot_level(level)
        cancelled = threading.Event()
        futures: list[Future[bool]] = []
        with self._lock:
            self._check_open()
            for cid, entry in zip(cids, self._cached_entries(cids)):
                if target in entry.res:
                    done: Future[bool] = Future()
                    done.set_result(True)
                    futures.append(done)
                else:
                    futures.append(
                        self._prefetcher.submit(self._prefetch_one, cid, target, entry.nbytes, cancelled)
                    )
        return Prefetch(futures, cancelled)

    def plan_load(
        self,
        namespace_id: bytes,
        keys: Sequence[bytes],
        prefill: PrefillModel,
        level: TierLevel | None = None,
    ) -> CostPlan:
        """The cost-aware decision for a chain: how much of its cached prefix beats recompute.

        A chunk's load time is its promotion into ``level`` from the fastest tier holding it plus the copy
        out of ``level`` into the engine, from the tiers' measured rates.

        Raises:
            NotFoundError: unknown namespace.
            InvalidArgumentError: malformed key, or ``level`` is not a slot tier.
        """
        cids = self._chunk_ids(namespace_id, keys)
        target = self._slot_level(level)
        layout = self._layout(namespace_id)
        nbytes = layout.chunk_bytes
        with self._lock:
            sources = [min(entry.res) for entry in self._cached_entries(cids)]
        copy_out = self._rates.load_seconds(target, nbytes)

        def chunk_seconds(source: TierLevel) -> float:
            bring = 0.0 if source == target else self._rates.load_seconds(source, nbytes)
            return bring + copy_out

        return plan_cost_aware(sources, layout.chunk_tokens, chunk_seconds, prefill)

    def rates(self) -> dict[TierLevel, TierRate]:
        """The measured (or prior) latency and bandwidth of each tier."""
        return {level: self._rates.rate(level) for level in self._levels}

    def report_usage(
        self, namespace_id: bytes, effective_by_tier: Mapping[TierLevel, int], recomputed_tokens: int
    ) -> None:
        """Record what the engine did with a load: prefill tokens it skipped (per source tier) and recomputed.

        Raises:
            NotFoundError: unknown namespace.
            InvalidArgumentError: negative counts or an unknown tier.
        """
        self.namespace(namespace_id)
        if (
            isinstance(recomputed_tokens, bool)
            or not isinstance(recomputed_tokens, int)
            or recomputed_tokens < 0
        ):
            raise InvalidArgumentError(
                "recomputed_tokens", f"must be a non-negative integer, got {recomputed_tokens!r}"
            )
        for level, tokens in effective_by_tier.items():
            if level not in self._tokens:
                raise InvalidArgumentError("effective_by_tier", f"{level!r} is not a tier of this cache")
            if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
                raise InvalidArgumentError(
                    "effective_by_tier", f"token counts must be non-negative, got {tokens!r}"
                )
        with self._lock:
            for level, tokens in effective_by_tier.items():
                self._tokens[level].effective_hit += tokens
            self._recomputed_tokens += recomputed_tokens

    def release(self, lease_id: int) -> bool:
        """End a lease. Returns False when it was unknown, already released or expired."""
        with self._lock:
            lease = self._leases.pop(lease_id, None)
            if lease is None:
                return False
            self._drop_lease(lease)
            return True

    def get(self, namespace_id: bytes, keys: Sequence[bytes]) -> list[torch.Tensor | None]:
        """Copies of cached chunks (CPU tensors), None for each chunk that is not cached.

        Reads come from the fastest tier holding each chunk; a chunk only in a slower tier is read once for
        all concurrent callers.

        Raises:
            NotFoundError: unknown namespace.
            InvalidArgumentError: malformed key.
        """
        cids = self._chunk_ids(namespace_id, keys)
        out: list[torch.Tensor | None] = []
        for cid in cids:
            out.append(self._get_one(cid))
        return out

    # ------------------------------------------------------------------ explicit movement and pinning

    def promote(self, namespace_id: bytes, keys: Sequence[bytes], level: TierLevel | None = None) -> int:
        """Copy cached chunks up into ``level`` (default the fastest tier); returns how many are there now.

        Raises:
            NotFoundError: unknown namespace.
            InvalidArgumentError: malformed key or unknown level.
        """
        cids = self._chunk_ids(namespace_id, keys)
        target = self._level(level)
        with self._lock:
            self._check_open()
            self._tick += 1
        return sum(self._ensure_in(cid, target) for cid in cids)

    def demote(self, namespace_id: bytes, keys: Sequence[bytes], level: TierLevel) -> int:
        """Move cached chunks down to ``level``: copy them there if needed, then drop them from faster tiers.

        Chunks under a lease in a faster tier keep that copy. Returns how many chunks are in ``level`` now.

        Raises:
            NotFoundError: unknown namespace.
            InvalidArgumentError: malformed key or unknown level.
        """
        cids = self._chunk_ids(namespace_id, keys)
        target = self._level(level)
        moved = 0
        with self._lock:
            self._check_open()
            self._tick += 1
            now = self._clock()
            self._reap(now)
            for cid in cids:
                entry = self._index.get(cid)
                if entry is None:
                    continue
                if target not in entry.res:
                    faster = [lv for lv in entry.res if lv < target]
                    if not faster or not self._copy(cid, entry, min(faster), target, now):
                        continue
                moved += 1
                for lv in [lv for lv in entry.res if lv < target]:
                    if entry.res[lv].leases == 0:
                        self._remove(cid, entry, lv, evicted=False)
        return moved

    def pin(self, namespace_id: bytes, keys: Sequence[bytes] | None = None) -> int:
        """Pin chunks (or, with ``keys`` None, the whole namespace): pinned chunks are never evicted.

        Returns:
            Chunks newly pinned (for a namespace: its cached chunks).

        Raises:
            NotFoundError: unknown namespace.
        """
        return self._set_pin(namespace_id, keys, True)

    def unpin(self, namespace_id: bytes, keys: Sequence[bytes] | None = None) -> int:
        """Undo :meth:`pin`. Returns chunks unpinned."""
        return self._set_pin(namespace_id, keys, False)

    def purge(self, namespace_id: bytes) -> int:
        """Remove every chunk of a namespace from every tier. Returns how many chunks it had.

        Copies under a lease stay until the lease ends but are invisible at once.

        Raises:
            NotFoundError: unknown namespace.
        """
        self.namespace(namespace_id)
        with self._lock:
            self._check_open()
            self._pinned_namespaces.discard(namespace_id)
            victims = [
                (cid, e) for cid, e in self._index.items() if e.namespace_id == namespace_id and not e.purged
            ]
            for cid, entry in victims:
                entry.purged = True
                for level in list(entry.res):
                    if entry.res[level].leases == 0:
                        self._remove(cid, entry, level, evicted=False)
            logger.info("purged namespace %s: %d chunks", namespace_id.hex(), len(victims))
            return len(victims)

    # ------------------------------------------------------------------ single-flight prefill

    def claim_prefill(
        self, namespace_id: bytes, keys: Sequence[bytes], ttl_s: float | None = None
    ) -> PrefillClaim:
        """Claim the uncached chunks of a chain that no other request is computing (see :mod:`tiercache.prefill`).

        The caller computes and stores the ``lead`` chunks (publishing each with ``commit_store`` as soon
        as it is done), waits for the ``wait`` chunks with :meth:`wait_prefill`, and releases the claim with
        :meth:`release_prefill` if it gives up.

        Raises:
            NotFoundError: unknown namespace.
            InvalidArgumentError: malformed key or bad TTL.
        """
        cids = self._chunk_ids(namespace_id, keys)
        ttl = self._ttl(ttl_s)
        return self._prefill.claim(cids, self._cached_prefix(cids), ttl)

    def wait_prefill(
        self, namespace_id: bytes, keys: Sequence[bytes], timeout_s: float, claim_id: int = 0
    ) -> int:
        """Wait until the next chunk the chain needs is cached or no longer being computed, or the timeout.

        Args:
            namespace_id: a registered namespace.
            keys: the request's key chain.
            timeout_s: the request's own deadline, from now.
            claim_id: the request's own claim, if it leads chunks further down the chain.

        Returns:
            The chain's contiguous cached prefix when the wait ends.

        Raises:
            NotFoundError: unknown namespace.
            InvalidArgumentError: malformed key or negative timeout.
        """
        cids = self._chunk_ids(namespace_id, keys)
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or timeout_s < 0:
            raise InvalidArgumentError(
                "timeout_s", f"must be a non-negative number of seconds, got {timeout_s!r}"
            )
        return self._prefill.wait(cids, lambda: self._cached_prefix(cids), float(timeout_s), claim_id)

    def release_prefill(self, claim_id: int) -> int:
        """Give up a prefill claim at once (waiters may take over). Returns the chunks released."""
        return self._prefill.release(claim_id)

    def _cached_prefix(self, cids: Sequence[bytes]) -> int:
        with self._lock:
            return len(self._cached_entries(cids))

    def _cached_entries(self, cids: Sequence[bytes]) -> list[_Chunk]:
        """Index entries of the contiguous cached prefix of a chain (caller holds the lock)."""
        entries = []
        for cid in cids:
            entry = self._index.get(cid)
            if entry is None or entry.purged:
                break
            entries.append(entry)
        return entries

    # ------------------------------------------------------------------ observation and lifecycle

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` for every chunk stored in or removed from a tier; returns an unsubscribe function.

        Listeners run under the manager's lock and must be quick and must not call the manager.
        """
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

    def stats(self) -> CacheStats:
        """A consistent snapshot of every tier and cache-wide counter."""
        with self._lock:
            self._reap(self._clock())
            tiers = []
            for level, tier in self._tiers.items():
                usage = tier.usage()
                c = self._counters[level]
                tokens = self._tokens[level]
                rate = self._rates.rate(level)
                tiers.append(
                    TierStats(
                        level=level,
                        lookup_hit_tokens=tokens.lookup_hit,
                        load_success_tokens=tokens.load_success,
                        effective_hit_tokens=tokens.effective_hit,
                        latency_s=rate.latency_s,
                        bytes_per_s=rate.bytes_per_s,
                        chunks=usage.chunks,
                        used_bytes=usage.used_bytes,
                        capacity_bytes=usage.capacity_bytes,
                        hits=c.hits,
                        misses=c.misses,
                        evictions=c.evictions,
                        promotions=c.promotions,
                        demotions=c.demotions,
                        corrupt_reads=usage.corrupt_reads,
                    )
                )
            return CacheStats(
                tiers=tuple(tiers),
                namespaces=len(self._namespaces),
                active_leases=len(self._leases),
                expired_leases=self._expired_leases,
                single_flight_joins=self._promotions.joins + self._reads.joins,
                pending_writes=len(self._pending),
                failed_writes=self._failed_writes,
                prefill=self._prefill.stats(),
                recomputed_tokens=self._recomputed_tokens,
            )

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every write-down queued so far has finished."""
        with self._lock:
            pending = list(self._pending)
        for fut in pending:
            fut.result(timeout=timeout_s)

    def close(self) -> None:
        """Finish queued write-downs, then close every tier (idempotent). Persistent tiers keep their chunks."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._prefetcher.shutdown(wait=True, cancel_futures=True)
        self._writer.shutdown(wait=True)
        with self._lock:
            for store in self._stores.values():
                self._tiers[store.level].abort(store.writes)
            self._stores.clear()
            for tier in self._tiers.values():
                tier.close()

    # ------------------------------------------------------------------ internals: validation

    def _check_open(self) -> None:
        if self._closed:
            raise ConflictError("the cache manager is closed")

    def _layout(self, namespace_id: bytes) -> KVLayout:
        return self.namespace(namespace_id).layout

    def _chunk_ids(self, namespace_id: bytes, keys: Sequence[bytes]) -> list[bytes]:
        self._layout(namespace_id)
        if isinstance(keys, (bytes, bytearray, str)):
            raise InvalidArgumentError("keys", "must be a sequence of keys, not a single value")
        return [chunk_id(bytes(namespace_id), check_key(k, f"keys[{i}]")) for i, k in enumerate(keys)]

    def _level(self, level: TierLevel | None) -> TierLevel:
        if level is None:
            return self._levels[0]
        if not isinstance(level, TierLevel) or level not in self._tiers:
            raise InvalidArgumentError("level", f"{level!r} is not a tier of this cache ({self._levels})")
        return level

    def _slot_level(self, level: TierLevel | None) -> TierLevel:
        if level is None:
            slot_levels = [lv for lv, t in self._tiers.items() if isinstance(t, SlotTier)]
            if not slot_levels:
                raise InvalidArgumentError("level", "this cache has no slot tier (L1 or L2) to load from")
            return slot_levels[0]
        level = self._level(level)
        if not isinstance(self._tiers[level], SlotTier):
            raise InvalidArgumentError("level", f"{level.name} has no slots to lease; use L1 or L2")
        return level

    def _ttl(self, ttl_s: float | None) -> float:
        if ttl_s is None:
            return self._config.lease_ttl_s
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, (int, float)) or not ttl_s > 0:
            raise InvalidArgumentError("ttl_s", f"must be a positive number of seconds, got {ttl_s!r}")
        return float(ttl_s)

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    # ------------------------------------------------------------------ internals: index bookkeeping

    def _rebuild(self) -> None:
        """Index the chunks persistent tiers already hold, oldest access first."""
        for level, tier in self._tiers.items():
            for cid, nbytes in tier.entries():
                try:
                    ns_id, key = split_chunk_id(cid)
                except InvalidArgumentError:
                    logger.warning(
                        "%s holds a chunk id of unexpected length %d; ignored", level.name, len(cid)
                    )
                    continue
                entry = self._index.get(cid)
                if entry is None:
                    entry = self._index[cid] = _Chunk(ns_id, key, 0, nbytes)
                self._tick += 1
                entry.res[level] = _Residency(self._tick, float("-inf"))
                self._order[level][cid] = None
            if self._order[level]:
                logger.info("%s: indexed %d chunks found at start", level.name, len(self._order[level]))

    def _add_residency(self, cid: bytes, entry: _Chunk, level: TierLevel, now: float) -> None:
        entry.res[level] = _Residency(self._tick, now)
        self._order[level][cid] = None
        self._emit(ChunkEvent(EventKind.STORED, level, entry.namespace_id, entry.key))

    def _known(self, cid: bytes) -> bool:
        """Cached, or being written into some tier (by a store or by a copy running unlocked)."""
        return (
            cid in self._index
            or cid in self._storing
            or any((cid, level) in self._copying for level in self._levels)
        )

    def _touch(self, cid: bytes, entry: _Chunk, level: TierLevel) -> None:
        entry.res[level].last_access = self._tick
        self._order[level].move_to_end(cid)

    def _remove(self, cid: bytes, entry: _Chunk, level: TierLevel, evicted: bool) -> None:
        """Drop one residency from the index (after, or instead of, deleting it from the tier)."""
        self._tiers[level].delete([cid])
        del entry.res[level]
        self._order[level].pop(cid, None)
        if not entry.res:
            del self._index[cid]
        if evicted:
            self._counters[level].evictions += 1
        self._emit(ChunkEvent(EventKind.REMOVED, level, entry.namespace_id, entry.key, evicted))

    def _emit(self, event: ChunkEvent) -> None:
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:
                logger.exception("chunk event listener failed")

    def _is_pinned(self, entry: _Chunk) -> bool:
        return entry.pinned or entry.namespace_id in self._pinned_namespaces

    def _set_pin(self, namespace_id: bytes, keys: Sequence[bytes] | None, pinned: bool) -> int:
        if keys is None:
            self.namespace(namespace_id)
            with self._lock:
                if pinned:
                    self._pinned_namespaces.add(namespace_id)
                else:
                    self._pinned_namespaces.discard(namespace_id)
                return sum(1 for e in self._index.values() if e.namespace_id == namespace_id)
        cids = self._chunk_ids(namespace_id, keys)
        changed = 0
        with self._lock:
            for cid in cids:
                entry = self._index.get(cid)
                if entry is not None and entry.pinned != pinned:
                    entry.pinned = pinned
                    changed += 1
        return changed

    # ------------------------------------------------------------------ internals: leases

    def _reap(self, now: float) -> None:
        """Reclaim leases and store tickets whose TTL has passed."""
        for lease_id in [i for i, ls in self._leases.items() if ls.expires_at <= now]:
            lease = self._leases.pop(lease_id)
            self._drop_lease(lease)
            self._expired_leases += 1
            logger.warning(
                "lease %d on %d chunks in %s expired", lease_id, len(lease.chunk_ids), lease.level.name
            )
        for ticket_id in [i for i, st in self._stores.items() if st.expires_at <= now]:
            store = self._stores.pop(ticket_id)
            self._storing.difference_update(ws.chunk_id for ws in store.writes)
            self._tiers[store.level].abort(store.writes)
            self._expired_leases += 1
            logger.warning(
                "store ticket %d expired before commit; %d chunks aborted", ticket_id, len(store.writes)
            )

    def _drop_lease(self, lease: _Lease) -> None:
        for cid in lease.chunk_ids:
            entry = self._index.get(cid)
            if entry is not None and lease.level in entry.res:
                res = entry.res[lease.level]
                res.leases -= 1
                if entry.purged and res.leases == 0:
                    self._remove(cid, entry, lease.level, evicted=False)

    def _lease_one(
        self, cid: bytes, level: TierLevel, lease: _Lease, bring: Callable[[], bool] | None
    ) -> TierLevel | None:
        """Add one chunk to a lease, bringing it into ``level`` first when needed.

        Returns:
            The tier the bytes came from (``level``, or the tier promoted from); None when not leased.
        """
        with self._lock:
            entry = self._index.get(cid)
            if entry is None or entry.purged:
                self._counters[level].misses += 1
                return None
            source = level if level in entry.res else min(entry.res)
            if level in entry.res:
                self._take(cid, entry, level, lease)
                return source
            self._counters[level].misses += 1
        if bring is None or not bring():
            return None
        with self._lock:
            entry = self._index.get(cid)
            if entry is None or entry.purged or level not in entry.res:
                return None
            self._take(cid, entry, level, lease)
            return source

    def _prefetch_one(self, cid: bytes, target: TierLevel, nbytes: int, cancelled: threading.Event) -> bool:
        if cancelled.is_set():
            return False
        self._prefetch_budget.acquire(nbytes)
        try:
            return not cancelled.is_set() and self._ensure_in(cid, target)
        finally:
            self._prefetch_budget.release(nbytes)

    def _take(self, cid: bytes, entry: _Chunk, level: TierLevel, lease: _Lease) -> None:
        entry.res[level].leases += 1
        lease.chunk_ids.append(cid)
        self._touch(cid, entry, level)
        self._record_hit(cid, entry, level)

    def _record_hit(self, cid: bytes, entry: _Chunk, level: TierLevel) -> None:
        self._counters[level].hits += 1
        entry.hits += 1
        if self._writes.on_hit(entry.hits):
            self._schedule_write_down(cid)

    # ------------------------------------------------------------------ internals: space

    def _reserve_from(
        self, target: TierLevel, cids: list[bytes], sizes: list[int]
    ) -> tuple[list[WriteSlot], TierLevel]:
        """Reserve in ``target`` or, failing that, the next slower tiers."""
        errors = []
        for level in [lv for lv in self._levels if lv >= target]:
            try:
                self._make_room(level, sizes)
                return self._tiers[level].reserve(cids, sizes), level
            except CapacityError as exc:
                errors.append(str(exc))
        raise CapacityError("no tier can hold the chunks: " + "; ".join(errors))

    def _make_room(self, level: TierLevel, sizes: Sequence[int]) -> None:
        """Evict from ``level`` until ``sizes`` fit. Raises CapacityError when not enough is evictable."""
        tier = self._tiers[level]
        need = sum(tier.charge(s) for s in sizes)
        usage = tier.usage()
        if need > usage.capacity_bytes:
            raise CapacityError(f"{level.name}: {need} bytes wanted, capacity is {usage.capacity_bytes}")
        if usage.free_bytes >= need:
            return
        now = self._clock()
        self._reap(now)
        for cid in self._victims(level, now):
            self._evict(cid, level, now)
            usage = tier.usage()
            if usage.free_bytes >= need:
                return
        raise CapacityError(
            f"{level.name}: {need} bytes wanted, {usage.free_bytes} free and nothing else evictable "
            "(leased, pinned or younger than the minimum residency)"
        )

    def _victims(self, level: TierLevel, now: float) -> Iterator[bytes]:
        """Evictable chunks of a tier in eviction order, lazily where the policy follows access order."""
        min_age = self._config.min_residency_s

        def ranked(cids: list[bytes]) -> list[bytes]:
            cands = []
            for cid in cids:
                entry = self._index[cid]
                res = entry.res[level]
                if res.leases > 0 or self._is_pinned(entry) or now - res.stored_at < min_age:
                    continue
                cands.append(
                    (self._eviction.priority(Candidate(res.last_access, entry.depth, entry.hits)), cid)
                )
            cands.sort()
            return [cid for _, cid in cands]

        snapshot = list(self._order[level])
        if not self._eviction.access_ordered:
            groups = [snapshot]
        else:
            # Access order is ordered by last access: rank one group of equal access time at a time.
            groups = []
            for cid in snapshot:
                tick = self._index[cid].res[level].last_access
                if groups and self._index[groups[-1][0]].res[level].last_access == tick:
                    groups[-1].append(cid)
                else:
                    groups.append([cid])
        for group in groups:
            for cid in ranked([c for c in group if c in self._index and level in self._index[c].res]):
                yield cid

    def _evict(self, cid: bytes, level: TierLevel, now: float) -> None:
        """Remove a victim from ``level``, first demoting it when no slower tier holds it and policy says so."""
        entry = self._index[cid]
        slower = [lv for lv in self._levels if lv > level]
        held_below = any(lv in entry.res or (cid, lv) in self._copying for lv in slower)
        keep = bool(slower) and not held_below and self._writes.on_evict(entry.hits, self._is_pinned(entry))
        if keep and not self._copy(cid, entry, level, slower[0], now):
            logger.debug("could not demote %s from %s; dropped", cid.hex(), level.name)
        self._remove(cid, entry, level, evicted=True)

    def _copy(self, cid: bytes, entry: _Chunk, src: TierLevel, dst: TierLevel, now: float) -> bool:
        """Copy a chunk between tiers under the lock (memory sources). False when it could not."""
        try:
            self._make_room(dst, [entry.nbytes])
            ws = self._tiers[dst].reserve([cid], [entry.nbytes])[0]
        except (CapacityError, ConflictError) as exc:
            logger.debug("no room for %s in %s: %s", cid.hex(), dst.name, exc)
            return False
        started = time.perf_counter()
        if not self._tiers[src].read_into([cid], [ws.buffer])[0]:
            self._tiers[dst].abort([ws])
            self._lost(cid, src)
            return False
        self._rates.observe(src, entry.nbytes, time.perf_counter() - started)
        self._tiers[dst].commit([ws])
        self._landed(cid, entry, src, dst, now)
        return True

    def _landed(self, cid: bytes, entry: _Chunk, src: TierLevel, dst: TierLevel, now: float) -> None:
        """Index a chunk that was copied from ``src`` into ``dst``."""
        # The chunk may have left every tier (and even been stored anew) while the copy ran unlocked.
        entry = self._index.setdefault(cid, entry)
        self._add_residency(cid, entry, dst, now)
        if dst < src:
            self._counters[dst].promotions += 1
        else:
            self._counters[dst].demotions += 1

    def _lost(self, cid: bytes, level: TierLevel) -> None:
        """A tier no longer has a chunk the index said it had (corrupt value deleted by the tier)."""
        entry = self._index.get(cid)
        if entry is not None and level in entry.res:
            self._counters[level].misses += 1
            self._remove(cid, entry, level, evicted=False)

    def _ensure_in(self, cid: bytes, target: TierLevel) -> bool:
        """Make sure a cached chunk is in ``target``; reads of slower tiers run unlocked and single-flight."""

        def bring() -> bool:
            with self._lock:
                entry = self._index.get(cid)
                if entry is None or entry.purged:
                    return False
                if target in entry.res:
                    return True
                src = min(entry.res)
                now = self._clock()
                if isinstance(self._tiers[src], SlotTier):
                    return self._copy(cid, entry, src, target, now)
                try:
                    self._make_room(target, [entry.nbytes])
                    ws = self._tiers[target].reserve([cid], [entry.nbytes])[0]
                except (CapacityError, ConflictError) as exc:
                    logger.debug("cannot bring %s into %s: %s", cid.hex(), target.name, exc)
                    return False
                self._copying.add((cid, target))
            started = time.perf_counter()
            try:
                ok = self._tiers[src].read_into([cid], [ws.buffer])[0]
            except BaseException:
                with self._lock:
                    self._copying.discard((cid, target))
                    self._tiers[target].abort([ws])
                raise
            with self._lock:
                self._copying.discard((cid, target))
                if not ok:
                    self._tiers[target].abort([ws])
                    self._lost(cid, src)
                    return False
                self._rates.observe(src, entry.nbytes, time.perf_counter() - started)
                self._tiers[target].commit([ws])
                self._counters[src].hits += 1
                self._landed(cid, entry, src, target, self._clock())
                return True

        return self._promotions.run((cid, target), bring)[0]

    def _get_one(self, cid: bytes) -> torch.Tensor | None:
        with self._lock:
            self._check_open()
            self._tick += 1
            entry = self._index.get(cid)
            if entry is not None and entry.purged:
                entry = None
            src = min(entry.res) if entry is not None else None
            for level in self._levels:
                if src is not None and level >= src:
                    break
                self._counters[level].misses += 1
            if entry is None or src is None:
                return None
            tier = self._tiers[src]
            if isinstance(tier, SlotTier):
                out = torch.empty(entry.nbytes, dtype=torch.uint8)
                tier.read_into([cid], [out])
                self._touch(cid, entry, src)
                self._record_hit(cid, entry, src)
                return out
            nbytes = entry.nbytes

        def read() -> torch.Tensor | None:
            buf = torch.empty(nbytes, dtype=torch.uint8)
            started = time.perf_counter()
            ok = tier.read_into([cid], [buf])[0]
            if ok:
                self._rates.observe(src, nbytes, time.perf_counter() - started)
            with self._lock:
                if not ok:
                    self._lost(cid, src)
                    return None
                current = self._index.get(cid)
                if current is not None and src in current.res:
                    self._touch(cid, current, src)
            return buf

        result, joined = self._reads.run((cid, src), read)
        if result is None:
            return None
        with self._lock:
            current = self._index.get(cid)
            if current is not None:
                self._record_hit(cid, current, src)
            else:
                self._counters[src].hits += 1
        return result.clone() if joined else result

    # ------------------------------------------------------------------ internals: write-down

    def _schedule_write_down(self, cid: bytes) -> None:
        """Queue copies of a chunk into every slower tier that lacks it (runs on the writer thread)."""
        if self._closed:
            return
        fut = self._writer.submit(self._write_down, cid)
        self._pending.add(fut)

        def done(f: Future[None]) -> None:
            with self._lock:
                self._pending.discard(f)

        fut.add_done_callback(done)

    def _write_down(self, cid: bytes) -> None:
        try:
            while self._write_down_step(cid):
                pass
        except Exception:
            logger.exception("write-down of %s failed", cid.hex())
            with self._lock:
                self._failed_writes += 1

    def _write_down_step(self, cid: bytes) -> bool:
        """Copy a chunk into the next slower tier lacking it. Returns True when a copy was made."""
        with self._lock:
            entry = self._index.get(cid)
            if entry is None or entry.purged:
                return False
            src = min(entry.res)
            missing = [
                lv
                for lv in self._levels
                if lv > src and lv not in entry.res and (cid, lv) not in self._copying
            ]
            if not missing:
                return False
            dst = missing[0]
            try:
                self._make_room(dst, [entry.nbytes])
                ws = self._tiers[dst].reserve([cid], [entry.nbytes])[0]
            except CapacityError as exc:
                self._failed_writes += 1
                logger.info("write-down of %s to %s skipped: %s", cid.hex(), dst.name, exc)
                return False
            except ConflictError:
                return False
            # The source is a memory tier: copying under the lock keeps it from being evicted meanwhile.
            if not self._tiers[src].read_into([cid], [ws.buffer])[0]:
                self._tiers[dst].abort([ws])
                self._lost(cid, src)
                return False
            self._copying.add((cid, dst))
        try:
            self._tiers[dst].commit([ws])
        except BaseException:
            with self._lock:
                self._copying.discard((cid, dst))
                self._tiers[dst].abort([ws])
            raise
        with self._lock:
            self._copying.discard((cid, dst))
            self._landed(cid, entry, src, dst, self._clock())
        return True
