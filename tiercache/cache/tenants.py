"""Tenants of one cache: who owns each namespace, what each tenant holds and did, and its quota's checks.

The core learns a namespace's tenant at registration (:meth:`CacheManager.register_namespace`). From then
on it counts, per tenant and tier, the chunks and bytes the tenant holds (fed by the index's chunk events, so
that every residency change is counted once; a chunk's bytes are its tier's charge), its evictions, and what
the cache facade sees of its traffic (lookup hits, loads, usage reports). Its open leases and tickets are
the ids the facade handed it that the lease table still holds. On these books :class:`Tenants` enforces the
tenant's :class:`~tiercache.cache.quotas.TenantQuota` (the sharing rule is in :mod:`tiercache.cache.quotas`)
and makes the tenant's own view of :meth:`CacheManager.stats`.

Chunks of a namespace nobody registered since the start (a warm L3) are counted per namespace and join
their tenant's books when the namespace is registered again. Every method runs under the cache's index lock
unless it says otherwise.

Primitives:
    WRITE_DOWN_WAIT_S: how long a store at its quota waits for write-downs holding its chunks.
    Tenants: set_quotas, register, on_event (the listener), on_found (a warm start's counts), protected
        (the eviction guard), placing, ttl, storing / leasing (admission of a store / an acquire), pins
        (:mod:`.pins`), trim / trim_tier (of promotions too: :mod:`.borrowing`), committed, opened_lease /
        opened_ticket, count_lookup / count_usage, stats, tenants, namespaces_of.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from tiercache.cache.borrowing import Promotions
from tiercache.cache.index import ChunkEntry
from tiercache.cache.parts import Parts
from tiercache.cache.pins import Pins
from tiercache.cache.quotas import NO_QUOTA, QuotaExceededError, QuotaTable, TenantQuota
from tiercache.cache.results import LoadTicket
from tiercache.cache.space import Space
from tiercache.stats import CacheStats, ChunkEvent, EventKind, PrefillStats, TierStats
from tiercache.tiers.base import TierLevel

logger = logging.getLogger(__name__)

_PLACING: contextvars.ContextVar[str | None] = contextvars.ContextVar("tiercache_placing", default=None)
"""The tenant whose store is making room in this thread (its own chunks are never protected from it)."""


@dataclass(slots=True)
class TenantTier:
    """One tenant's figures in one tier."""

    chunks: int = 0
    used_bytes: int = 0
    payload_bytes: int = 0
    hits: int = 0
    evictions: int = 0
    lookup_hit_tokens: int = 0
    load_success_tokens: int = 0
    effective_hit_tokens: int = 0


@dataclass(slots=True)
class TenantBooks:
    """One tenant's books."""

    namespaces: set[bytes] = field(default_factory=set)
    tiers: dict[TierLevel, TenantTier] = field(default_factory=lambda: defaultdict(TenantTier))
    leases: set[int] = field(default_factory=set)
    tickets: set[int] = field(default_factory=set)
    pending_leases: int = 0  # acquires admitted and not booked yet
    pending_tickets: int = 0  # stores admitted and not booked yet
    recomputed_tokens: int = 0


WRITE_DOWN_WAIT_S = 1.0
"""Longest a store at its tenant's quota waits for queued write-downs that hold the tenant's only evictable
chunks (a write-through copy takes milliseconds; without the wait the store would be refused meanwhile)."""


class Tenants:
    """Per-tenant books and quota checks of one cache."""

    def __init__(self, parts: Parts, space: Space, default_ttl_s: float) -> None:
        """Args: the cache's parts, its victim queues, and the default lease / ticket lifetime."""
        self._lock = parts.lock
        self._clock = parts.clock
        self._tiers = parts.tiers
        self._levels = sorted(parts.tiers)
        self._index = parts.index
        self._leases = parts.leases
        self._mover = parts.mover
        self._writeback = parts.writeback
        self._reap = parts.reap
        self._space = space
        self._default_ttl_s = default_ttl_s
        self._quotas = QuotaTable()
        self._limited = False
        self._tenant: dict[bytes, str] = {}
        self._charge: dict[bytes, dict[TierLevel, int]] = {}
        self._chunk_bytes: dict[bytes, int] = {}
        self._ns_chunks: dict[bytes, dict[TierLevel, int]] = defaultdict(lambda: defaultdict(int))
        self._books: dict[str, TenantBooks] = defaultdict(TenantBooks)
        self._ticket_cids: dict[int, tuple[bytes, list[bytes]]] = {}
        parts.mover.admit = Promotions(parts, self).admitting  # promotions count against their tenant
        self.pins = Pins(parts, self)

    # ------------------------------------------------------------------ setup and books

    def set_quotas(self, quotas: QuotaTable) -> None:
        """Replace the quota table (takes the lock)."""
        with self._lock:
            self._quotas = quotas
            self._limited = quotas.active
        logger.info("tenant quotas: %s", "on" if quotas.active else "off")

    @property
    def limited(self) -> bool:
        """Whether any tenant has a limit (no lock: the flag is replaced whole)."""
        return self._limited

    def quota(self, tenant: str) -> TenantQuota:
        """The quota of a tenant."""
        return self._quotas.of(tenant) if self._quotas.active else NO_QUOTA

    def register(self, namespace_id: bytes, tenant: str, chunk_bytes: int) -> None:
        """File a namespace under its tenant (idempotent; takes the lock)."""
        with self._lock:
            if namespace_id in self._tenant:
                return
            charge = {level: tier.charge(chunk_bytes) for level, tier in self._tiers.items()}
            self._tenant[namespace_id] = tenant
            self._charge[namespace_id] = charge
            self._chunk_bytes[namespace_id] = chunk_bytes
            books = self._books[tenant]
            books.namespaces.add(namespace_id)
            for level, chunks in self._ns_chunks.get(namespace_id, {}).items():
                books.tiers[level].chunks += chunks
                books.tiers[level].used_bytes += chunks * charge[level]
                books.tiers[level].payload_bytes += chunks * chunk_bytes

    def tenant_of(self, namespace_id: bytes) -> str | None:
        """The tenant of a registered namespace."""
        return self._tenant.get(namespace_id)

    def tenants(self) -> list[str]:
        """Tenants that registered a namespace (takes the lock)."""
        with self._lock:
            return sorted({t for t in self._tenant.values()})

    def on_event(self, event: ChunkEvent) -> None:
        """Count a residency change (the index's listener)."""
        delta = 1 if event.kind == EventKind.STORED else -1
        self._ns_chunks[event.namespace_id][event.level] += delta
        tenant = self._tenant.get(event.namespace_id)
        if tenant is None:
            return
        tier = self._books[tenant].tiers[event.level]
        tier.chunks += delta
        tier.used_bytes += delta * self._charge[event.namespace_id][event.level]
        tier.payload_bytes += delta * self._chunk_bytes[event.namespace_id]
        if event.evicted:
            tier.evictions += 1

    def on_found(self, level: TierLevel, counts: Mapping[bytes, int]) -> None:
        """Count the chunks a warm start found in a tier, by namespace id (the index's bulk announcement:
        the same books as one STORED event per chunk)."""
        for namespace_id, chunks in counts.items():
            self._ns_chunks[namespace_id][level] += chunks
            tenant = self._tenant.get(namespace_id)
            if tenant is not None:
                tier = self._books[tenant].tiers[level]
                tier.chunks += chunks
                tier.used_bytes += chunks * self._charge[namespace_id][level]
                tier.payload_bytes += chunks * self._chunk_bytes[namespace_id]

    def namespaces_of(self, tenant: str) -> set[bytes]:
        """The namespace ids a tenant registered."""
        return self._books[tenant].namespaces

    def used_bytes(self, tenant: str, level: TierLevel) -> int:
        """Bytes a tenant's chunks take in a tier."""
        return self._books[tenant].tiers[level].used_bytes if tenant in self._books else 0

    # ------------------------------------------------------------------ sharing under pressure

    def protected(self, level: TierLevel, entry: ChunkEntry) -> bool:
        """Whether a chunk must not be evicted for someone else: its tenant holds no more than its share."""
        tenant = self._tenant.get(entry.namespace_id)
        if tenant is None or tenant == _PLACING.get():
            return False
        share = self.quota(tenant).tier_bytes(level)
        return share > 0 and self.used_bytes(tenant, level) <= share

    @contextlib.contextmanager
    def placing(self, namespace_id: bytes) -> Iterator[None]:
        """A context in which room made in this thread is made for the tenant of ``namespace_id`` (no lock)."""
        token = _PLACING.set(self._tenant.get(namespace_id))
        try:
            yield
        finally:
            _PLACING.reset(token)

    def trim(self, namespace_id: bytes, cids: Sequence[bytes], level: TierLevel) -> None:
        """Before a store: evict the tenant's own chunks until its new chunks fit its quota in every quota'd
        tier at or below ``level`` (with a write-through policy a stored chunk reaches each of them).

        Call without the lock: a chunk only in the trimmed tier is copied down first, with the lock released.

        Raises:
            QuotaExceededError: the chunks cannot fit (more than the quota, or none of its own evictable).
        """
        with self._lock:
            pending = sum(1 for c in cids if not self._mover.known(c))
        self._trim(namespace_id, level, lambda lv: pending, WRITE_DOWN_WAIT_S)

    def _trim(
        self, namespace_id: bytes, level: TierLevel, pending: Callable[[TierLevel], int], settle_s: float
    ) -> None:
        """Trim every quota'd tier at or below ``level`` to leave room for ``pending(tier)`` more chunks,
        waiting up to ``settle_s`` once for queued write-downs when they hold the only candidates."""
        tenant = self._tenant.get(namespace_id)
        if tenant is None:
            return
        quota = self.quota(tenant)
        for lv in [lv for lv in self._levels if lv >= level and quota.tier_bytes(lv)]:
            self.trim_tier(tenant, namespace_id, lv, quota.tier_bytes(lv), pending, settle_s)

    def trim_tier(
        self,
        tenant: str,
        namespace_id: bytes,
        level: TierLevel,
        cap: int,
        pending: Callable[[TierLevel], int],
        settle_s: float,
    ) -> None:
        """Evict the tenant's own chunks from ``level`` until they and ``pending(level)`` more fit ``cap``.

        What is held and what is still to come are read together under the lock, each time round: a
        write-down that lands in between moves a chunk from one count to the other, and read apart the
        chunk would count twice, so that the trim would evict copies just written (the tenant's own, but
        for nothing)."""
        limit = f"{level.name.lower()}_bytes"
        slower = [lv for lv in self._levels if lv > level]
        charge = self._charge[namespace_id][level]
        settled = settle_s <= 0
        while True:
            with self._lock:
                used = self.used_bytes(tenant, level)
                need = charge * pending(level)
                if used + need <= cap:
                    return
                if need > cap:
                    raise QuotaExceededError(
                        tenant, limit, cap, f"{need} bytes wanted at once in {level.name}"
                    )
                victim = self._space.victim(
                    level,
                    self._clock(),
                    self._index.entries,
                    self._index.pinned_namespaces,
                    accept=lambda e: self._tenant.get(e.namespace_id) == tenant,
                )
                if victim is None and (settled or not self._writeback.pending):
                    raise QuotaExceededError(
                        tenant, limit, cap,
                        f"{used} bytes held in {level.name}, {need} more wanted, and none of its own chunks "
                        "there can be evicted (leased, pinned or younger than the minimum residency)",
                    )  # fmt: skip
                if victim is not None:
                    entry = self._index.get(victim)
                    assert entry is not None
                    copy_to = slower[0] if slower and not any(lv > level for lv in entry.levels) else None
                    if copy_to is not None:
                        self._index.hold(victim, entry, level)
            if victim is None:  # queued write-downs hold the chunks they copy: wait for them, once
                settled = True
                self._writeback.settle(settle_s)
                continue
            if copy_to is not None:
                try:
                    self._mover.move(victim, copy_to)
                finally:
                    with self._lock:
                        self._index.unhold(victim, level)
            with self._lock:
                entry = self._index.get(victim)
                if entry is not None and entry.has_copy(level) and entry.copy(level).holds == 0:
                    self._mover.drop(victim, entry, level, evicted=True)

    # ------------------------------------------------------------------ limits

    def ttl(self, namespace_id: bytes, ttl_s: float | None) -> float | None:
        """The lifetime to ask the cache for: the tenant's cap shortens the default and refuses more."""
        tenant = self._tenant.get(namespace_id)
        cap = self.quota(tenant).max_ttl_s if tenant is not None else 0.0
        if not cap:
            return ttl_s
        if ttl_s is None:
            return min(self._default_ttl_s, cap)
        if ttl_s > cap:
            raise QuotaExceededError(
                tenant or "", "max_ttl_s", cap, f"a lifetime of {ttl_s:g} s was asked for"
            )
        return ttl_s

    @contextlib.contextmanager
    def storing(self, namespace_id: bytes, cids: Sequence[bytes]) -> Iterator[None]:
        """A context for one ``begin_store`` (no lock held): refuses it beyond the tenant's open tickets or,
        into a pinned namespace, its pinned bytes; holds a place among the tenant's tickets until the ticket
        is booked (:meth:`opened_ticket`), so that concurrent stores cannot overrun the limit; and makes the
        room its reservation needs as the tenant's (:meth:`placing`)."""
        tenant = self._tenant.get(namespace_id)
        quota = self.quota(tenant) if tenant is not None else NO_QUOTA
        books = self._books[tenant] if tenant is not None and quota.limited else None
        if tenant is not None and books is not None:
            with self._lock:
                self._reap(self._clock())
                open_now = self._open(books.tickets, self._leases.store) + books.pending_tickets
                if quota.tickets and open_now >= quota.tickets:
                    raise QuotaExceededError(
                        tenant, "tickets", quota.tickets, "that many store tickets are open"
                    )
                if quota.pinned_bytes and namespace_id in self._index.pinned_namespaces:
                    new = sum(1 for c in cids if not self._mover.known(c))
                    self.pins.check_pinned(tenant, quota.pinned_bytes, new * self._chunk_bytes[namespace_id])
                books.pending_tickets += 1
        try:
            with self.placing(namespace_id):
                yield
        finally:
            if books is not None:
                with self._lock:
                    books.pending_tickets -= 1

    @contextlib.contextmanager
    def leasing(self, namespace_id: bytes) -> Iterator[None]:
        """A context for one ``acquire`` (no lock held): refuses it beyond the tenant's open leases, holds a
        place among them until the lease is booked (:meth:`opened_lease`), and makes room as the tenant's."""
        tenant = self._tenant.get(namespace_id)
        quota = self.quota(tenant) if tenant is not None else NO_QUOTA
        books = self._books[tenant] if tenant is not None and quota.leases else None
        if tenant is not None and books is not None:
            with self._lock:
                self._reap(self._clock())
                if self._open(books.leases, self._leases.lease) + books.pending_leases >= quota.leases:
                    raise QuotaExceededError(tenant, "leases", quota.leases, "that many load leases are open")
                books.pending_leases += 1
        try:
            with self.placing(namespace_id):
                yield
        finally:
            if books is not None:
                with self._lock:
                    books.pending_leases -= 1

    @staticmethod
    def _open(ids: set[int], lookup: Callable[[int], object | None]) -> int:
        """Prune the ids the lease table no longer holds; returns how many are left."""
        ids.difference_update([i for i in ids if lookup(i) is None])
        return len(ids)

    def opened_lease(self, ticket: LoadTicket) -> None:
        """Book a lease the facade handed out, and its chunks as reads by source tier (not as loaded)."""
        tenant = self._tenant.get(ticket.namespace_id)
        if tenant is None:
            return
        with self._lock:
            books = self._books[tenant]
            if ticket.lease_id:
                books.leases.add(ticket.lease_id)
            for chunk in ticket.chunks:
                books.tiers[chunk.source].hits += 1

    def opened_ticket(self, namespace_id: bytes, ticket_id: int, cids: Sequence[bytes]) -> None:
        """Book a store ticket the facade handed out (``cids``: its chain's chunk ids)."""
        tenant = self._tenant.get(namespace_id)
        if tenant is not None:
            with self._lock:
                self._books[tenant].tickets.add(ticket_id)
                self._ticket_cids[ticket_id] = (namespace_id, list(cids))

    def committed(self, ticket_id: int) -> None:
        """After a commit (no lock held): trim the tenant back to its byte quotas, which the evictions its
        reservation caused may have overrun (an evicted copy demoted into a slower tier). A tenant whose own
        chunks cannot go stays over its quota: above its share, its chunks are evictable by anyone."""
        with self._lock:
            booked = self._ticket_cids.get(ticket_id)
            if booked is not None and self._leases.store(ticket_id) is None:
                del self._ticket_cids[ticket_id]
        if booked is None or not self._quotas.active:
            return
        namespace_id, cids = booked

        def pending(level: TierLevel) -> int:  # committed chunks a write-down will still bring into level
            with self._lock:
                entries = [self._index.visible(c) for c in cids]
            return sum(1 for e in entries if e is not None and not e.has_copy(level))

        try:
            self._trim(namespace_id, self._levels[0], pending, 0.0)  # best effort: a commit never waits
        except QuotaExceededError as exc:
            logger.debug("after commit of ticket %d: %s", ticket_id, exc)

    # ------------------------------------------------------------------ traffic and views

    def count_lookup(self, namespace_id: bytes, fastest: Mapping[TierLevel, int], chunk_tokens: int) -> None:
        """Count an engine lookup's cached prefix: ``fastest`` chunks by the fastest tier holding each (as the
        index counted them)."""
        tenant = self._tenant.get(namespace_id)
        if tenant is None or not chunk_tokens:
            return
        tiers = self._books[tenant].tiers
        for level, chunks in fastest.items():
            tiers[level].lookup_hit_tokens += chunks * chunk_tokens

    def count_usage(
        self,
        namespace_id: bytes,
        effective_by_tier: Mapping[TierLevel, int],
        recomputed: int,
        loaded_by_tier: Mapping[TierLevel, int],
    ) -> None:
        """Count an engine's usage report (the tenant's loaded, effective and recomputed tokens)."""
        tenant = self._tenant.get(namespace_id)
        if tenant is None:
            return
        books = self._books[tenant]
        for level, tokens in effective_by_tier.items():
            books.tiers[level].effective_hit_tokens += tokens
        for level, tokens in loaded_by_tier.items():
            books.tiers[level].load_success_tokens += tokens
        books.recomputed_tokens += recomputed

    def stats(self, tenant: str, full: CacheStats) -> CacheStats:
        """A tenant's own view of the cache: its chunks, bytes, traffic, leases and namespaces per tier, its
        quota as each quota'd tier's capacity; nothing of other tenants (figures the core keeps only
        cache-wide, such as misses or write-down counts, are 0). Tier rates stay: they describe the host."""
        books = self._books.get(tenant, TenantBooks())
        quota = self.quota(tenant)
        tiers = []
        for t in full.tiers:
            own = books.tiers.get(t.level, TenantTier())
            capacity = quota.tier_bytes(t.level) or t.capacity_bytes
            tiers.append(
                TierStats(
                    level=t.level,
                    chunks=own.chunks,
                    used_bytes=own.used_bytes,
                    capacity_bytes=capacity,
                    hits=own.hits,
                    misses=0,
                    evictions=own.evictions,
                    promotions=0,
                    demotions=0,
                    corrupt_reads=0,
                    lookup_hit_tokens=own.lookup_hit_tokens,
                    load_success_tokens=own.load_success_tokens,
                    effective_hit_tokens=own.effective_hit_tokens,
                    latency_s=t.latency_s,
                    bytes_per_s=t.bytes_per_s,
                    payload_bytes=own.payload_bytes,
                    utilisation=own.payload_bytes / capacity if capacity else 0.0,
                )
            )
        prefill = PrefillStats(**{f.name: 0 for f in dataclasses.fields(PrefillStats)})
        return CacheStats(
            tiers=tuple(tiers),
            namespaces=len(books.namespaces),
            active_leases=self._open(books.leases, self._leases.lease),
            expired_leases=0,
            single_flight_joins=0,
            pending_writes=0,
            failed_writes=0,
            prefill=prefill,
            recomputed_tokens=books.recomputed_tokens,
        )
