"""The cache manager facade: the public API of the cache core, its argument checks and its lock.

Chunks are filed by ``(namespace id, chunk key)`` of a registered namespace. Stores are two-phase (begin ->
the caller fills the buffers -> commit or abort); loads lease the chunks in a slot tier (promoting them from
slower tiers first) so that they cannot be evicted while the caller copies them. Leases, store tickets and
prefill claims have a TTL, capped by the config's ``max_ttl_s``: a caller that dies cannot hold space forever,
and a caller cannot ask to. The parts of :mod:`tiercache.cache` do the work; this module checks arguments
(:mod:`tiercache.cache.checks`), takes the lock where a call spans parts, and joins them.

Locks, and what runs outside them:
    index lock (``CacheManager._lock``, one ``RLock`` shared by every part): guards the namespace
        registry, the index (residency, recency, holds, pins, counters), the victim queues, the lease /
        ticket table, the listeners, the mover's ``storing`` and ``copying`` sets, and the calls that
        change a tier's contents (reserve, abort, delete; a store's commit files in the index under it) so
        index and tiers agree whenever the lock is free. Listeners run under it.
    tier locks (inside each tier): taken by tier methods only; always after the index lock, never the
        other way round (tiers never call the cache).
    single-flight tables (mover moves, L3 reads of ``get``), the write-back worker's pending set, the
        prefetch byte budget and the prefill coordinator's lock: each taken alone or after the index lock;
        nothing waits on a flight or the budget while holding the index lock.
    Outside the index lock: every byte copy (promotion, demotion, write-down, eviction demotion, ``get``),
        a store's tier commit (its slots claimed in ``storing``, out of the ticket) and the commit that
        ends a move (the L3 disk write), always on a *held* source copy (kept from eviction, its slot from
        reuse) into a reservation nobody else can see; then the lock is taken again to index or to abort.
    Eviction runs under the index lock, except that a victim to demote is held, copied down with the lock
        released, then dropped. Moves into tier ``d`` wait only on moves into slower tiers: no cycles.

Primitives:
    CacheManager: register_namespace, lookup, begin_store / commit_store / abort_store / open_store_chunks,
        put, acquire / release, prefetch, plan_load, rates, report_usage, get, promote, demote, pin / unpin,
        purge, claim_prefill / wait_prefill / release_prefill, subscribe, stats, set_quotas / tenants
        (per-tenant books and quotas: :mod:`tiercache.cache.tenants`), flush, close.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager

import torch

from tiercache.cache import checks
from tiercache.cache.claims import PrefillClaims
from tiercache.cache.config import CacheConfig
from tiercache.cache.discovery import Discovery
from tiercache.cache.index import ChunkEntry, Index
from tiercache.cache.leases import LeaseTable
from tiercache.cache.listeners import Listeners
from tiercache.cache.loads import Loads
from tiercache.cache.mover import Mover
from tiercache.cache.namespaces import Namespaces
from tiercache.cache.parts import Parts, held_if_free
from tiercache.cache.prefetch import Prefetcher
from tiercache.cache.quotas import QuotaTable
from tiercache.cache.results import Listener, LoadTicket, LookupResult, Prefetch, StoreTicket
from tiercache.cache.space import Space
from tiercache.cache.stores import Stores
from tiercache.cache.tenants import Tenants
from tiercache.cache.writeback import WriteBack
from tiercache.errors import ConflictError, InvalidArgumentError
from tiercache.keys import Namespace
from tiercache.policies import make_eviction_policy, make_write_policy
from tiercache.policies.load import CostPlan, PrefillModel
from tiercache.prefill import PrefillClaim, PrefillCoordinator
from tiercache.rates import RateEstimator, TierRate
from tiercache.stats import CacheStats
from tiercache.tiers.base import StorageTier, TierLevel

logger = logging.getLogger(__name__)
_Positions = Sequence[int] | None
_Sums = Mapping[int, int] | None


class CacheManager:
    """Index, policies and data movement over an ordered set of tiers. Thread-safe.

    Every call that takes a ``namespace_id`` raises NotFoundError (field ``namespace_id``) when it is not
    registered; every call that takes ``keys`` raises InvalidArgumentError (``keys`` / ``keys[i]``) for a
    malformed key chain, and every call that takes a ``level`` InvalidArgumentError (``level``) for a tier
    this cache does not have. A call that changes the cache after :meth:`close` raises ConflictError.
    """

    def __init__(
        self,
        tiers: Sequence[StorageTier],
        config: CacheConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Take ownership of the tiers and rebuild the index from the persistent ones (warm restart).

        ``tiers``: one to four, of distinct levels, in any order; ``config``: policies and timing (defaults
        when None); ``clock``: monotonic seconds that leases, tickets and minimum residency are measured
        with. Raises InvalidArgumentError for no tiers, or two tiers of one level.
        """
        if not tiers:
            raise InvalidArgumentError("tiers", "at least one tier is needed")
        levels = [t.level for t in tiers]
        if len(set(levels)) != len(levels):
            raise InvalidArgumentError("tiers", f"duplicate tier levels {sorted(levels)}")
        self._config = cfg = config or CacheConfig()
        self._clock = clock
        self._tiers = by_level = {t.level: t for t in sorted(tiers, key=lambda t: t.level)}
        self._levels = list(self._tiers)
        self._lock = lock = threading.RLock()
        self._listeners = Listeners(lock)
        self._namespaces = Namespaces(lock, by_level)
        self._closed = False
        writes = make_write_policy(cfg.write_policy, cfg.selective_min_hits)
        guard = self._protected  # tenants within their guaranteed share (self._tenants, set below)
        policy = make_eviction_policy(cfg.eviction_policy)
        self._space = Space(self._levels, policy, cfg.min_residency_s, guard)
        self._index = index = Index(self._levels, self._space, self._listeners.emit)
        self._leases = leases = LeaseTable()
        self._rates = RateEstimator()
        self._prefill = PrefillCoordinator(clock)
        rates, prefill, reap = self._rates, self._prefill, self._reap
        self._mover = mover = Mover(lock, by_level, index, self._space, writes, rates, clock, reap)
        self._writeback = writeback = WriteBack(mover.write_down_step, cfg.catch_up_spare_cores)
        parts = Parts(lock, clock, by_level, index, leases, mover, writes, writeback, reap)
        self._stores = Stores(parts, prefill)
        self._loads = Loads(parts, rates)
        self._claims = PrefillClaims(lock, index, prefill)
        self._prefetcher = Prefetcher(cfg.prefetch_workers, cfg.prefetch_inflight_bytes, mover.move)
        self._discovery = Discovery(lock, by_level, index, mover, clock)
        self._tenants = Tenants(parts, self._space, cfg.lease_ttl_s)
        self._listeners.add(self._tenants.on_event)
        index.rebuild(by_level, self._tenants.on_found)

    # ------------------------------------------------------------------ registration and lookup

    def register_namespace(self, namespace: Namespace, tenant: str = "") -> bytes:
        """Register a namespace for a tenant (idempotent) and return its id: ``tenant`` is the authenticated
        tenant, each tenant's chunks are filed under an id of its own. Raises InvalidArgumentError
        (``layout``) when its chunks do not fit the tiers."""
        ns_id = self._namespaces.register(namespace, tenant, self._check_open)
        self._tenants.register(ns_id, tenant, namespace.layout.chunk_bytes)
        return ns_id

    def set_quotas(self, quotas: QuotaTable) -> None:
        """Set the tenants' quotas (:mod:`tiercache.cache.quotas`: limits, and how capacity is shared)."""
        self._tenants.set_quotas(quotas)

    def tenants(self) -> list[str]:
        """The tenants that registered a namespace."""
        return self._tenants.tenants()

    @property
    def levels(self) -> tuple[TierLevel, ...]:
        """The tiers of this cache, fastest first."""
        return tuple(self._levels)

    def tier(self, level: TierLevel) -> StorageTier:
        """The tier of a level (owned by the manager: use it only to read its identity, e.g. an L2 segment)."""
        return self._tiers[checks.tier_level(self._tiers, level)]

    def namespace(self, namespace_id: bytes) -> Namespace:
        """The registered namespace of an id."""
        return self._namespaces.get(namespace_id)

    def lookup(self, namespace_id: bytes, keys: Sequence[bytes], count: bool = False) -> LookupResult:
        """Per tier, and over all tiers, the length of the contiguous cached prefix of ``keys``. ``count``:
        count the hit in the token-weighted lookup statistics (an engine's request; internal and diagnostic
        lookups leave the counters alone)."""
        ns, cids = self._chain(namespace_id, keys)
        chunk_tokens = ns.layout.chunk_tokens if count else 0
        with self._lock:
            result, fastest = self._index.lookup(cids, chunk_tokens)
            self._tenants.count_lookup(namespace_id, fastest, chunk_tokens)
            return result

    def lookup_now(self, namespace_id: bytes, keys: Sequence[bytes]) -> LookupResult | None:
        """An engine's :meth:`lookup` (counted) if it answers at once (:meth:`uncontended`), else None."""
        with self.uncontended() as free:
            return self.lookup(namespace_id, keys, True) if free else None

    def uncontended(self) -> AbstractContextManager[bool]:
        """Holds the index lock for a ``with`` block where no call can wait (True): it was free and no shared
        tier is asked (network I/O). Lookups, leases of chunks in their tier and releases then run at once."""
        return held_if_free(self._lock, TierLevel.SHARED not in self._tiers)

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
        ``keys`` may be a part of a chain starting at position ``start_depth``; the reservation lapses (is
        aborted) after ``ttl_s`` seconds (default the config's lease TTL). Raises InvalidArgumentError for
        duplicate keys, a bad TTL (one above ``max_ttl_s`` is refused, not clamped) or depth; CapacityError when no tier at or below ``level`` can make room.
        """
        layout = self.namespace(namespace_id).layout
        cids = self._namespaces.chunk_ids(namespace_id, keys)
        if len(set(cids)) != len(cids):
            raise InvalidArgumentError("keys", "a key appears twice in one chain")
        checks.count(start_depth, "start_depth")
        target = checks.tier_level(self._tiers, level)
        ttl = self._ttl(self._tenants.ttl(namespace_id, ttl_s))
        with self._tenants.storing(namespace_id, cids):
            self._tenants.trim(namespace_id, cids, target)
            ticket = self._stores.begin(
                namespace_id, keys, cids, layout.chunk_bytes, target, ttl, start_depth, self._check_open
            )
            self._tenants.opened_ticket(namespace_id, ticket.ticket_id, cids)
        return ticket

    def commit_store(self, ticket_id: int, indices: _Positions = None, checksums: _Sums = None) -> int:
        """Make a ticket's chunks visible and apply the write policy. Returns how many chunks it added.

        ``indices``: chain positions (``StoreSlot.index``) to publish now, the ticket staying open for the
        rest (prefill publication); None: all that are left, closing it. ``checksums``: position -> its slot
        bytes' xxh3-64, taken as they were written (not hashed again). Raises NotFoundError for an unknown,
        finished or expired ticket, InvalidArgumentError for an index that is not an open slot of it.
        """
        with self._lock:
            self._check_open()
        added = self._stores.commit(ticket_id, indices, checksums)  # the tier's commit without the lock
        self._tenants.committed(ticket_id)
        return added

    def abort_store(self, ticket_id: int) -> bool:
        """Discard a ticket's reservations. Returns False when the ticket was unknown or already finished."""
        return self._stores.abort(ticket_id)

    def open_store_chunks(self, ticket_id: int) -> int | None:
        """How many chunks an open store ticket still holds; None when it is not open."""
        with self._lock:
            store = self._leases.store(ticket_id)
            return None if store is None else len(store.indices)

    def put(
        self,
        namespace_id: bytes,
        keys: Sequence[bytes],
        payloads: Sequence[torch.Tensor],
        start_depth: int = 0,
    ) -> int:
        """Store whole chunks by copy (begin, copy, commit). Returns how many chunks were added.

        Raises what ``begin_store`` raises, and InvalidArgumentError when payloads and keys differ in number
        or a payload has the wrong size.
        """
        layout = self.namespace(namespace_id).layout
        if len(payloads) != len(keys):
            raise InvalidArgumentError("payloads", f"{len(payloads)} payloads for {len(keys)} keys")
        for i, payload in enumerate(payloads):
            layout.check_buffer(payload, field=f"payloads[{i}]")
        ticket = self.begin_store(namespace_id, keys, start_depth=start_depth)
        self._stores.fill(ticket, payloads)
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
        (a slot tier, default the fastest one) for lack of room, because its only copy turned out corrupt,
        or not in time. The lease lives ``ttl_s`` (default the config's TTL). ``wait_s`` bounds the wait for
        promotions: None for as long as it takes, 0 for not at all (only chunks already in ``level``), else
        a deadline from now; promotions still running at the deadline go on in the background. Raises
        InvalidArgumentError for a bad TTL (above ``max_ttl_s``: refused, not clamped) or wait, or a
        ``level`` that is not a slot tier.
        """
        _, cids = self._chain(namespace_id, keys)
        target = checks.slot_level(self._tiers, level)
        ttl = self._ttl(self._tenants.ttl(namespace_id, ttl_s))
        deadline = None
        if wait_s is not None:
            wait_s = checks.seconds(wait_s, "wait_s", message="must be None or a non-negative number")
            deadline = time.monotonic() + wait_s if wait_s else 0.0
        background = self.prefetch(namespace_id, keys, target) if wait_s else None
        with self._tenants.leasing(namespace_id):
            ticket = self._loads.acquire(
                namespace_id, keys, cids, target, ttl, deadline, background, self._check_open
            )
            self._tenants.opened_lease(ticket)
        return ticket

    def prefetch(
        self, namespace_id: bytes, keys: Sequence[bytes], level: TierLevel | None = None
    ) -> Prefetch:
        """Start promoting the cached prefix of ``keys`` into a slot tier in the background.

        Promotions of one chunk coalesce with any other in flight (one read), and the bytes in flight are
        bounded by ``prefetch_inflight_bytes``. Raises InvalidArgumentError if ``level`` is not a slot tier.
        """
        _, cids = self._chain(namespace_id, keys)
        target = checks.slot_level(self._tiers, level)
        with self._lock:
            self._check_open()
            plan = [(c, e.nbytes, e.has_copy(target)) for c, e in zip(cids, self._index.cached_prefix(cids))]
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
        out of ``level`` into the engine, from the tiers' measured rates. Raises InvalidArgumentError if
        ``level`` is not a slot tier.
        """
        ns, cids = self._chain(namespace_id, keys)
        target = checks.slot_level(self._tiers, level)
        return self._loads.plan(cids, target, ns.layout, prefill)

    def rates(self) -> dict[TierLevel, TierRate]:
        """The measured (or prior) latency and bandwidth of each tier."""
        return {level: self._rates.rate(level) for level in self._levels}

    def report_usage(
        self,
        namespace_id: bytes,
        effective_by_tier: Mapping[TierLevel, int],
        recomputed_tokens: int,
        loaded_by_tier: Mapping[TierLevel, int],
        read_keys: Sequence[bytes] = (),
    ) -> None:
        """Count an engine's usage report (the only count of loaded tokens) and its published-index reads."""
        self.namespace(namespace_id)
        checks.usage(effective_by_tier, recomputed_tokens, self._index.tokens, loaded_by_tier)
        usage = (effective_by_tier, recomputed_tokens, loaded_by_tier)
        with self._lock:
            self._index.report_usage(*usage, namespace_id, read_keys)
            self._tenants.count_usage(namespace_id, *usage)

    def release(self, lease_id: int) -> bool:
        """End a lease. Returns False when it was unknown, already released or expired."""
        return self._loads.release(lease_id)

    def get(self, namespace_id: bytes, keys: Sequence[bytes]) -> list[torch.Tensor | None]:
        """Copies of cached chunks (CPU tensors), None for each chunk that is not cached; each read from the
        fastest tier holding it (a chunk only in a slower tier is read once for all concurrent callers)."""
        _, cids = self._chain(namespace_id, keys)
        return [self._loads.read(cid, self._check_open) for cid in cids]

    # ------------------------------------------------------------------ explicit movement and pinning

    def promote(self, namespace_id: bytes, keys: Sequence[bytes], level: TierLevel | None = None) -> int:
        """Copy cached chunks up into ``level`` (default the fastest tier); returns how many are there now."""
        cids = self._namespaces.chunk_ids(namespace_id, keys)
        return self._mover.move_many(cids, checks.tier_level(self._tiers, level), self._check_open)

    def demote(self, namespace_id: bytes, keys: Sequence[bytes], level: TierLevel) -> int:
        """Move cached chunks down to ``level``: copy them there if needed, then drop them from faster tiers
        (a copy under a lease stays). Returns how many chunks are in ``level`` now."""
        cids = self._namespaces.chunk_ids(namespace_id, keys)
        return self._mover.demote(cids, checks.tier_level(self._tiers, level), self._check_open)

    def pin(self, namespace_id: bytes, keys: Sequence[bytes] | None = None) -> int:
        """Pin chunks (or, with ``keys`` None, the whole namespace) so that they are never evicted; returns
        the chunks newly pinned (for a namespace: its cached chunks)."""
        return self._set_pin(namespace_id, keys, True)

    def unpin(self, namespace_id: bytes, keys: Sequence[bytes] | None = None) -> int:
        """Undo :meth:`pin`. Returns chunks unpinned."""
        return self._set_pin(namespace_id, keys, False)

    def purge(self, namespace_id: bytes) -> int:
        """Remove every chunk of a namespace from every tier; returns how many it had. Copies under a lease
        stay until the lease ends, but are invisible at once."""
        self.namespace(namespace_id)
        with self._lock:
            self._check_open()
            chunks = self._mover.purge(namespace_id)
            logger.info("purged namespace %s: %d chunks", namespace_id.hex(), chunks)
            return chunks

    def _set_pin(self, namespace_id: bytes, keys: Sequence[bytes] | None, pinned: bool) -> int:
        if keys is None:
            self.namespace(namespace_id)
        cids = None if keys is None else self._namespaces.chunk_ids(namespace_id, keys)
        return self._tenants.pins.pin(namespace_id, cids, pinned)

    # ------------------------------------------------------------------ single-flight prefill

    def claim_prefill(
        self, namespace_id: bytes, keys: Sequence[bytes], ttl_s: float | None = None
    ) -> PrefillClaim:
        """Claim the uncached chunks of a chain that no other request is computing (see :mod:`tiercache.prefill`).

        The caller computes and stores the ``lead`` chunks (publishing each with ``commit_store`` as soon
        as it is done), waits for the ``wait`` chunks with :meth:`wait_prefill`, and releases the claim with
        :meth:`release_prefill` if it gives up. ``ttl_s`` defaults to the config's lease TTL. Raises
        InvalidArgumentError for a bad TTL (above ``max_ttl_s``: refused, not clamped).
        """
        cids = self._namespaces.chunk_ids(namespace_id, keys)
        ttl = self._ttl(self._tenants.ttl(namespace_id, ttl_s))
        return self._claims.claim(cids, ttl)

    def wait_prefill(
        self, namespace_id: bytes, keys: Sequence[bytes], timeout_s: float, claim_id: int = 0
    ) -> int:
        """Wait until the next chunk the chain needs is cached or no longer being computed, or the timeout.

        ``timeout_s`` is the request's own deadline from now; ``claim_id`` the request's own claim, if it
        leads chunks further down the chain. Returns the chain's contiguous cached prefix when the wait ends.
        Raises InvalidArgumentError for a negative timeout.
        """
        cids = self._namespaces.chunk_ids(namespace_id, keys)
        timeout = checks.seconds(timeout_s, "timeout_s")
        return self._claims.wait(cids, timeout, claim_id)

    def release_prefill(self, claim_id: int) -> int:
        """Give up a prefill claim at once (waiters may take over). Returns the chunks released."""
        return self._prefill.release(claim_id)

    # ------------------------------------------------------------------ observation and lifecycle

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` for every chunk stored in or removed from a tier (under the manager's lock: it
        must be quick and must not call the manager); returns an unsubscribe function."""
        return self._listeners.add(listener)

    def stats(self, tenant: str | None = None) -> CacheStats:
        """A consistent snapshot of every tier and cache-wide counter; with ``tenant``, that tenant's own
        view (its chunks, bytes and traffic only: :meth:`Tenants.stats`)."""
        with self._lock:
            self._reap(self._clock())
            full = CacheStats(
                tiers=tuple(
                    self._index.tier_stats(lv, t.usage(), self._rates.rate(lv))
                    for lv, t in self._tiers.items()
                ),
                namespaces=len(self._namespaces),
                active_leases=self._leases.active_leases,
                expired_leases=self._leases.expired,
                single_flight_joins=self._mover.joins + self._loads.joins,
                pending_writes=self._writeback.pending,
                failed_writes=self._writeback.failed,
                prefill=self._prefill.stats(),
                recomputed_tokens=self._index.recomputed_tokens,
                deferred_writes=self._writeback.deferred,
            )
            return full if tenant is None else self._tenants.stats(tenant, full)

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every write-down queued so far has finished, deferred ones included."""
        self._writeback.flush(timeout_s)

    def close(self) -> None:
        """Finish write-downs (deferred ones for ``stop_write_down_s``), close the tiers (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._prefetcher.close()
        self._writeback.close(self._config.stop_write_down_s)
        with self._lock:
            self._stores.discard_all()
            for tier in self._tiers.values():
                tier.close()
        self._index.thaw()  # what a large warm start froze (its objects are garbage soon)

    # ------------------------------------------------------------------ internals: checks and wiring

    def _protected(self, level: TierLevel, entry: ChunkEntry) -> bool:
        return self._tenants.protected(level, entry)

    def _check_open(self) -> None:
        if self._closed:
            raise ConflictError("the cache manager is closed")

    def _chain(self, namespace_id: bytes, keys: Sequence[bytes]) -> tuple[Namespace, list[bytes]]:
        """A chain's namespace (resolved once) and ids, after indexing what only the shared tier holds."""
        ns, cids = self._namespaces.chain(namespace_id, keys)
        self._discovery.extend(namespace_id, cids, ns.layout.chunk_bytes)
        return ns, cids

    def _ttl(self, ttl_s: float | None) -> float:
        """The lifetime of a lease, ticket or claim: every requested TTL is resolved and capped here."""
        return checks.lifetime(ttl_s, self._config.lease_ttl_s, self._config.max_ttl_s)

    def _reap(self, now: float) -> None:
        """Reclaim leases and store tickets whose TTL has passed (under the lock)."""
        leases, stores = self._leases.reap(now)
        self._loads.expire(leases)
        self._stores.expire(stores)
