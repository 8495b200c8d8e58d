"""The cache manager facade: the public API of the cache core, its argument checks and its lock.

Chunks are filed by ``(namespace id, chunk key)``. A namespace must be registered before use. Stores are
two-phase (begin -> the caller fills the buffers -> commit or abort); loads lease the chunks in a slot tier
(promoting them from slower tiers first) so that they cannot be evicted while the caller copies them.
Leases and store tickets have a TTL: a caller that dies cannot hold space forever. The work is done by the
parts of :mod:`tiercache.cache`; this module wires them together.

Locks, and what runs outside them:
    index lock (``CacheManager._lock``, one ``RLock`` shared by every part): guards the index (residency,
        recency, holds, pins, counters), the victim queues, the lease / ticket table, the mover's
        ``storing`` and ``copying`` sets, and the calls that change a tier's contents (reserve, commit of a
        store, abort, delete) so that index and tiers agree whenever the lock is free. Listeners run under
        it.
    tier locks (inside each tier): taken by tier methods only; always after the index lock, never the
        other way round (tiers never call the cache).
    single-flight tables (mover moves, L3 reads of ``get``), the write-back worker's pending set, the
        prefetch byte budget and the prefill coordinator's lock: each taken alone or after the index lock;
        nothing waits on a flight or the budget while holding the index lock.
    Outside the index lock: every byte copy (promotion, demotion, write-down, eviction demotion, ``get``)
        and the commit that ends a move (the L3 disk write), always on a source copy that is *held* (a hold
        keeps it from eviction and its slot from reuse) and into a reservation nobody else can see; then
        the lock is taken again to index the result or to abort and drop a lost copy.
    Eviction runs under the index lock, except that a victim which must be demoted is held, copied down
        with the lock released, then dropped. Moves into tier ``d`` wait only on moves into slower tiers,
        so flights never wait in a cycle.

Primitives:
    CacheManager: register_namespace, lookup, begin_store / commit_store / abort_store, put, acquire /
        release, prefetch, plan_load, rates, report_usage, get, promote, demote, pin / unpin, purge,
        claim_prefill / wait_prefill / release_prefill, subscribe, stats, flush, close.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from types import MappingProxyType

import torch

from tiercache.cache.config import CacheConfig
from tiercache.cache.index import Index
from tiercache.cache.leases import Lease, LeaseTable
from tiercache.cache.loads import Loads
from tiercache.cache.mover import Mover
from tiercache.cache.prefetch import Prefetcher, wait_until
from tiercache.cache.results import Listener, LoadChunk, LoadTicket, LookupResult, Prefetch, StoreTicket
from tiercache.cache.space import Space
from tiercache.cache.stores import Stores
from tiercache.cache.writeback import WriteBack
from tiercache.errors import ConflictError, InvalidArgumentError, NotFoundError
from tiercache.keys import Namespace, check_key, chunk_id
from tiercache.layout import KVLayout
from tiercache.policies import make_eviction_policy, make_write_policy
from tiercache.policies.load import CostPlan, PrefillModel, plan_cost_aware
from tiercache.prefill import PrefillClaim, PrefillCoordinator
from tiercache.rates import RateEstimator, TierRate
from tiercache.stats import CacheStats, ChunkEvent
from tiercache.tiers.base import SlotTier, StorageTier, TierLevel

logger = logging.getLogger(__name__)


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
        self._lock = threading.RLock()
        self._listeners: list[Listener] = []
        self._namespaces: dict[bytes, Namespace] = {}
        self._closed = False
        writes = make_write_policy(self._config.write_policy, self._config.selective_min_hits)
        self._space = Space(
            self._levels, make_eviction_policy(self._config.eviction_policy), self._config.min_residency_s
        )
        self._index = Index(self._levels, self._space, self._emit)
        self._leases = LeaseTable()
        self._rates = RateEstimator()
        self._prefill = PrefillCoordinator(clock)
        self._mover = Mover(
            self._lock, self._tiers, self._index, self._space, writes, self._rates, clock, self._reap
        )
        self._writeback = WriteBack(self._mover.write_down_step)
        self._stores = Stores(
            self._lock,
            clock,
            self._tiers,
            self._index,
            self._leases,
            self._mover,
            writes,
            self._writeback,
            self._prefill,
            self._reap,
        )
        self._loads = Loads(self._lock, self._tiers, self._index, self._mover, writes, self._writeback)
        self._prefetcher = Prefetcher(
            self._config.prefetch_workers, self._config.prefetch_inflight_bytes, self._mover.move
        )
        self._index.rebuild(self._tiers)

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

    def tier(self, level: TierLevel) -> StorageTier:
        """The tier of a level (owned by the manager: use it only to read its identity, e.g. an L2 segment).

        Raises:
            InvalidArgumentError: not a tier of this cache.
        """
        return self._tiers[self._level(level)]

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
            cached = self._index.cached_prefix(cids)
            for level in self._levels:
                by_tier[level] = next((i for i, e in enumerate(cached) if level not in e.res), len(cached))
            if count:
                chunk_tokens = self._namespaces[namespace_id].layout.chunk_tokens
                for entry in cached:
                    self._index.tokens[min(entry.res)].lookup_hit += chunk_tokens
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
        return self._stores.begin(
            namespace_id, keys, cids, layout.chunk_bytes, target, ttl, start_depth, self._check_open
        )

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
            return self._stores.commit(ticket_id, indices)

    def abort_store(self, ticket_id: int) -> bool:
        """Discard a ticket's reservations. Returns False when the ticket was unknown or already finished."""
        return self._stores.abort(ticket_id)

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
        deadline = time.monotonic() + wait_s if wait_s else 0.0
        background = self.prefetch(namespace_id, keys, target) if wait_s else None
        with self._lock:
            self._check_open()
            self._index.next_tick()
            now = self._clock()
            self._reap(now)
            lease = Lease(target, [], now + ttl)
            lease_id = self._leases.new_id()
            self._leases.add_lease(lease_id, lease)
        chunks: list[LoadChunk] = []
        try:
            for i, cid in enumerate(cids):
                bring: Callable[[], bool] | None
                if wait_s is None:
                    bring = partial(self._mover.move, cid, target)
                elif background is not None and i < len(background.futures):
                    bring = partial(wait_until, background.futures[i], deadline)
                else:
                    bring = None
                source = self._loads.lease_one(cid, target, lease, bring)
                if source is None:
                    break
                slot, view = self._loads.view(cid, target)
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
                    self._index.tokens[ch.source].load_success += chunk_tokens
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
        with self._lock:
            self._check_open()
            plan = [(cid, e.nbytes, target in e.res) for cid, e in zip(cids, self._index.cached_prefix(cids))]
            return self._prefetcher.start(plan, target)

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
            sources = [min(entry.res) for entry in self._index.cached_prefix(cids)]
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
            if level not in self._index.tokens:
                raise InvalidArgumentError("effective_by_tier", f"{level!r} is not a tier of this cache")
            if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
                raise InvalidArgumentError(
                    "effective_by_tier", f"token counts must be non-negative, got {tokens!r}"
                )
        with self._lock:
            for level, tokens in effective_by_tier.items():
                self._index.tokens[level].effective_hit += tokens
            self._index.recomputed_tokens += recomputed_tokens

    def release(self, lease_id: int) -> bool:
        """End a lease. Returns False when it was unknown, already released or expired."""
        with self._lock:
            lease = self._leases.take_lease(lease_id)
            if lease is None:
                return False
            self._loads.drop_lease(lease)
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
        return [self._loads.read(cid, self._check_open) for cid in cids]

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
            self._index.next_tick()
        return self._mover.move_many(cids, target)

    def demote(self, namespace_id: bytes, keys: Sequence[bytes], level: TierLevel) -> int:
        """Move cached chunks down to ``level``: copy them there if needed, then drop them from faster tiers.

        Chunks under a lease in a faster tier keep that copy. Returns how many chunks are in ``level`` now.

        Raises:
            NotFoundError: unknown namespace.
            InvalidArgumentError: malformed key or unknown level.
        """
        cids = self._chunk_ids(namespace_id, keys)
        target = self._level(level)
        with self._lock:
            self._check_open()
            self._index.next_tick()
            self._reap(self._clock())
        return self._mover.demote(cids, target)

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
            self._index.pinned_namespaces.discard(namespace_id)
            victims = self._index.of_namespace(namespace_id)
            for cid, entry in victims:
                for level in self._index.purge(entry, cid):
                    self._mover.drop(cid, entry, level, evicted=False)
            logger.info("purged namespace %s: %d chunks", namespace_id.hex(), len(victims))
            return len(victims)

    def _set_pin(self, namespace_id: bytes, keys: Sequence[bytes] | None, pinned: bool) -> int:
        if keys is None:
            self.namespace(namespace_id)
            with self._lock:
                return self._index.pin_namespace(namespace_id, pinned)
        cids = self._chunk_ids(namespace_id, keys)
        with self._lock:
            return self._index.pin(cids, pinned)

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
            return len(self._index.cached_prefix(cids))

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
            tiers = tuple(
                self._index.tier_stats(level, tier.usage(), self._rates.rate(level))
                for level, tier in self._tiers.items()
            )
            return CacheStats(
                tiers=tiers,
                namespaces=len(self._namespaces),
                active_leases=self._leases.active_leases,
                expired_leases=self._leases.expired,
                single_flight_joins=self._mover.joins + self._loads.joins,
                pending_writes=self._writeback.pending,
                failed_writes=self._writeback.failed,
                prefill=self._prefill.stats(),
                recomputed_tokens=self._index.recomputed_tokens,
            )

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every write-down queued so far has finished."""
        self._writeback.flush(timeout_s)

    def close(self) -> None:
        """Finish queued write-downs, then close every tier (idempotent). Persistent tiers keep their chunks."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._prefetcher.close()
        self._writeback.close()
        with self._lock:
            for store in self._leases.take_all_stores():
                self._stores.discard(store)
            for tier in self._tiers.values():
                tier.close()

    # ------------------------------------------------------------------ internals

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

    def _emit(self, event: ChunkEvent) -> None:
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:
                logger.exception("chunk event listener failed")

    def _reap(self, now: float) -> None:
        """Reclaim leases and store tickets whose TTL has passed (under the lock)."""
        leases, stores = self._leases.reap(now)
        for lease_id, lease in leases:
            self._loads.drop_lease(lease)
            logger.warning(
                "lease %d on %d chunks in %s expired", lease_id, len(lease.chunk_ids), lease.level.name
            )
        for ticket_id, store in stores:
            self._stores.discard(store)
            logger.warning(
                "store ticket %d expired before commit; %d chunks aborted", ticket_id, len(store.writes)
            )
