"""Residency: which chunk is in which tier, the one record of recency, pins and counters.

Every chunk the cache knows is a :class:`ChunkEntry` filed by storage id (namespace id + key); each tier
holding it is a :class:`Residency` with the logical time of its last access (one tick per cache operation, so
chunks touched by one request share it) and the number of holds on it (leases and copies out of it in
flight: a held residency is never evicted). Every change is passed on to :class:`~tiercache.cache.space.Space`
so that victim choice never scans the index, and announced to listeners as a :class:`ChunkEvent`.

The index never touches a tier: the caller deletes a chunk from its tier before it drops the residency.
Not thread-safe: every method runs under the cache's index lock.

Primitives:
    Residency, ChunkEntry: one chunk and its copies (defined in :mod:`tiercache.cache.entries`, compact
        for a million chunks; import them from either).
    TierCounters, TokenCounters: per-tier counters.
    FoundCounts: how a warm start announces the chunks it found.
    Index: rebuild (and thaw), tier_stats, lookups (get, visible, cached_prefix, lookup, of_namespace), changes
        (add_residency, touch, record_hit, hold, unhold, remove_residency, purge), pins (is_pinned, pin,
        pin_namespace), token counts (lookup, report_usage), tick.
"""

from __future__ import annotations

import itertools
import logging
import operator
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import cast

from tiercache.cache.entries import ChunkEntry as ChunkEntry  # re-exported: the index's entries
from tiercache.cache.entries import Residency as Residency
from tiercache.cache.entries import tier_bit
from tiercache.cache.results import LookupResult
from tiercache.cache.space import Space
from tiercache.gcpause import collector_paused, settle, thaw
from tiercache.heaptrim import release_free_heap
from tiercache.keys import CHUNK_ID_BYTES, NAMESPACE_ID_BYTES, chunk_id
from tiercache.rates import TierRate
from tiercache.stats import ChunkEvent, EventKind, TierStats
from tiercache.tiers.base import StorageTier, TierLevel, TierUsage
from tiercache.tiers.depths import DepthKeeper, HeldChunks

logger = logging.getLogger(__name__)

_PURGED = operator.attrgetter("purged")
_TRUTH = operator.truth
_TIERS = operator.attrgetter("tiers")
_NAMESPACE_ID = operator.attrgetter("namespace_id")
_LONG_AGO = float("-inf")  # when a copy found at start arrived: its minimum residency is long over

FoundCounts = Callable[[TierLevel, Mapping[bytes, int]], None]
"""Told of the chunks a warm start found in a tier: ``(tier, chunks by namespace id)``."""


def _first(flags: Iterable[bool]) -> int:
    """The index of the first true flag, or how many there are when none is true (C-speed)."""
    marks = list(flags)
    try:
        return marks.index(True)
    except ValueError:
        return len(marks)


@dataclass(slots=True)
class TierCounters:
    """Operation counters of one tier."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    promotions: int = 0
    demotions: int = 0
    dropped_chunks: int = 0  # copies the cache meant to keep here (or keep from here) and could not


@dataclass(slots=True)
class TokenCounters:
    """Token-weighted hit counters of one tier."""

    lookup_hit: int = 0
    load_success: int = 0
    effective_hit: int = 0


class Index:
    """The chunks of a cache and their residencies."""

    def __init__(self, levels: Sequence[TierLevel], space: Space, emit: Callable[[ChunkEvent], None]) -> None:
        """Args: levels: the cache's tiers; space: told of every change; emit: receives chunk events."""
        self._entries: dict[bytes, ChunkEntry] = {}
        # ids of the purged entries still filed (a held copy keeps one until its hold ends): while there is
        # none, a lookup's walk skips its test of every entry of the prefix for being purged
        self._purged: set[bytes] = set()
        self._space = space
        self._emit = emit
        self.pinned_namespaces: set[bytes] = set()
        self.counters = {level: TierCounters() for level in levels}
        self.tokens = {level: TokenCounters() for level in levels}
        self.recomputed_tokens = 0
        self.tick = 0
        self._frozen = False  # a large rebuild froze the collector's objects (see thaw)

    def rebuild(self, tiers: Mapping[TierLevel, StorageTier], found: FoundCounts) -> None:
        """Index the chunks the tiers already hold (a warm L3), oldest access first (``entries()`` order).

        A tier that keeps chain depths (:class:`~tiercache.tiers.depths.DepthKeeper`) gives back the depths
        it stored, and is bound to :meth:`depth_hint` so that it stores the depths of later commits.

        The chunks found in a tier are announced to ``found`` once, as chunk counts by namespace id, not as
        a :class:`ChunkEvent` each (at start nothing but the cache's own books listens, and a million
        events cost seconds).

        Built in bulk, without Python work per chunk where a C-speed map does it: each chunk gets its own
        tick in the tier's order, its namespace id is shared with the other chunks of its namespace, each
        tier's victims are ranked at once (``EvictionPolicy.queue_items``) and queued in one heapify, with
        the garbage collector paused and, after a large build, every object it tracks frozen before it
        resumes (:mod:`tiercache.gcpause`; resumed first, it would walk the whole new index again and again),
        until :meth:`thaw`; then the free pages its temporaries (and the tiers' scans) left in the C heap are
        given back (:mod:`tiercache.heaptrim`).
        """
        with collector_paused():
            self._frozen = settle(self._rebuild(tiers, found))
        if self._frozen:
            release_free_heap()

    def thaw(self) -> None:
        """Give the objects a large :meth:`rebuild` froze back to the collector (the owner closes: cycles of
        its object graph can be collected again); nothing when it froze none."""
        if self._frozen:
            self._frozen = False
            thaw()

    def _rebuild(self, tiers: Mapping[TierLevel, StorageTier], announce: FoundCounts) -> int:
        """:meth:`rebuild`; returns the residencies filed."""
        filed = 0
        for level, tier in tiers.items():
            if isinstance(tier, DepthKeeper):
                held = tier.depth_entries()
                tier.bind_depths(self.depth_hint)
            else:
                listed = tier.entries()
                held = HeldChunks([c for c, _ in listed], [n for _, n in listed], [None] * len(listed))
            found = self._index_found(level, held)
            if found:
                announce(level, Counter(map(_NAMESPACE_ID, found)))
                logger.info("%s: indexed %d chunks found at start", level.name, len(found))
            filed += len(found)
        return filed

    def _index_found(self, level: TierLevel, held: HeldChunks) -> list[ChunkEntry]:
        """File and rank ``level``'s residency of each held chunk (one tick each, in order); returns them."""
        depths: list[int] = cast("list[int]", held.depths)
        if None in depths:  # a C-speed test: depths are usually all known, the list is used as it is
            depths = [0 if d is None else d for d in held.depths]
        ids, nbytes = held.ids, held.nbytes
        if set(map(len, ids)) - {CHUNK_ID_BYTES}:
            for cid in ids:
                if len(cid) != CHUNK_ID_BYTES:
                    logger.warning(
                        "%s holds a chunk id of unexpected length %d; ignored", level.name, len(cid)
                    )
            keep = [i for i, cid in enumerate(ids) if len(cid) == CHUNK_ID_BYTES]
            ids, nbytes, depths = [ids[i] for i in keep], [nbytes[i] for i in keep], [depths[i] for i in keep]
        ticks = list(range(self.tick + 1, self.tick + 1 + len(ids)))  # one int each, shared with the ranks
        self.tick += len(ids)
        if self._entries and any(map(self._entries.__contains__, ids)):
            return self._index_known(level, ids, nbytes, depths, ticks)
        ns_len, namespaces = NAMESPACE_ID_BYTES, dict[bytes, bytes]()
        ns_ids = [cid[:ns_len] for cid in ids]
        ns_ids = list(map(namespaces.setdefault, ns_ids, ns_ids))  # one object per namespace
        copies = map(Residency, itertools.repeat(level), ticks, itertools.repeat(_LONG_AGO))
        found = list(map(ChunkEntry, ns_ids, ids, depths, nbytes, itertools.repeat(tier_bit(level)), copies))
        self._entries.update(zip(ids, found))
        self._space.queue(level).push_many(self._space.policy(level).queue_items(ticks, depths, ids))
        return found

    def _index_known(
        self, level: TierLevel, ids: list[bytes], nbytes: list[int], depths: list[int], ticks: list[int]
    ) -> list[ChunkEntry]:
        """:meth:`_index_found` when some chunks are known already (held by a faster tier): chunk by chunk."""
        found: list[ChunkEntry] = []
        ns_len, namespaces = NAMESPACE_ID_BYTES, dict[bytes, bytes]()
        for cid, size, depth, tick in zip(ids, nbytes, depths, ticks, strict=True):
            res = Residency(level, tick, _LONG_AGO)
            entry = self._entries.get(cid)
            if entry is None:
                ns_id = namespaces.setdefault(cid[:ns_len], cid[:ns_len])
                entry = ChunkEntry(ns_id, cid, depth, size, tier_bit(level), res)
                self._entries[cid] = entry
            else:
                entry.add_copy(res)
            self._space.refresh(cid, entry)
            found.append(entry)
        return found

    def depth_hint(self, cid: bytes) -> int | None:
        """The chain depth of a known chunk, None for an unknown one.

        Safe without the cache's lock: one dict lookup and one attribute read of an int, each atomic; a
        stale answer costs only the eviction order of one chunk after a restart.
        """
        entry = self._entries.get(cid)
        return None if entry is None else entry.depth

    def tier_stats(self, level: TierLevel, usage: TierUsage, rate: TierRate) -> TierStats:
        """The stats of one tier: its counters with the tier's usage and measured rate."""
        c, tokens = self.counters[level], self.tokens[level]
        return TierStats(
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
            dropped_chunks=c.dropped_chunks,
            errors=usage.errors,
            payload_bytes=usage.payload_bytes,
            utilisation=usage.payload_bytes / usage.capacity_bytes if usage.capacity_bytes else 0.0,
        )

    # ------------------------------------------------------------------ lookups

    def __len__(self) -> int:
        """Chunks known (purged ones with held copies included)."""
        return len(self._entries)

    def __iter__(self) -> Iterator[bytes]:
        """Chunk ids known."""
        return iter(list(self._entries))

    @property
    def entries(self) -> dict[bytes, ChunkEntry]:
        """The entries by chunk id (read-only use)."""
        return self._entries

    def get(self, cid: bytes) -> ChunkEntry | None:
        """The entry of a chunk, purged or not."""
        return self._entries.get(cid)

    def visible(self, cid: bytes) -> ChunkEntry | None:
        """The entry of a cached (not purged) chunk."""
        entry = self._entries.get(cid)
        return None if entry is None or entry.purged else entry

    def cached_prefix(self, cids: Sequence[bytes]) -> list[ChunkEntry]:
        """Entries of the contiguous cached prefix of a chain."""
        # Every lookup walks its chain: in C-speed bulk operations (map, takewhile), no Python per chunk; an
        # entry is always true (no __len__ or __bool__), so the prefix ends at the first None. Its entries
        # are tested for being purged only while a purged one is filed (rare: a purge whose copy is held),
        # a third of the walk of a 512-key chain saved (~12 us on the dev host).
        cached = cast("list[ChunkEntry]", list(itertools.takewhile(_TRUTH, map(self._entries.get, cids))))
        if self._purged and any(map(_PURGED, cached)):
            cached = cached[: _first(map(_PURGED, cached))]
        return cached

    def lookup(
        self, cids: Sequence[bytes], count_tokens: int = 0
    ) -> tuple[LookupResult, dict[TierLevel, int]]:
        """Per tier, and over all tiers, the length of the contiguous cached prefix of a chain; and, with
        ``count_tokens``, how many of the prefix's chunks each tier is the fastest holder of.

        Args:
            cids: the chain's chunk ids.
            count_tokens: tokens per chunk to count as lookup hits of the fastest tier holding each chunk
                of the prefix (an engine's request); 0 leaves the counters alone (and counts nothing).
        """
        cached = self.cached_prefix(cids)
        tiers = list(map(_TIERS, cached))  # bit sets of the holders: no object beyond the entry is touched
        n = len(tiers)
        if not n or tiers.count(tiers[0]) == n:  # the usual case: every chunk in the same tiers (one pass)
            holders = tiers[0] if n else 0
            by_tier = {level: n if holders & tier_bit(level) else 0 for level in self.tokens}
            lowest_bit = holders & -holders
            fastest = {level: n for level in self.tokens if n and tier_bit(level) == lowest_bit}
        else:
            by_tier = {
                level: _first(
                    map(operator.not_, map(operator.and_, tiers, itertools.repeat(tier_bit(level))))
                )
                for level in self.tokens
            }
            # the fastest holder's bit of each (the lowest bit set)
            lowest = list(map(operator.and_, tiers, map(operator.neg, tiers)))
            fastest = {level: k for level in self.tokens if (k := lowest.count(tier_bit(level)))}
        if not count_tokens:
            return LookupResult(n, MappingProxyType(by_tier)), {}
        for level, chunks in fastest.items():
            self.tokens[level].lookup_hit += chunks * count_tokens
        return LookupResult(n, MappingProxyType(by_tier)), fastest

    def report_usage(
        self,
        effective_by_tier: Mapping[TierLevel, int],
        recomputed_tokens: int,
        loaded_by_tier: Mapping[TierLevel, int],
        namespace_id: bytes = b"",
        read_keys: Iterable[bytes] = (),
    ) -> None:
        """Count what an engine did with a load: tokens it copied intact and skipped (per source tier), and
        recomputed; and the chunks of ``namespace_id`` it read through the published index
        (:meth:`read_published`)."""
        self.read_published(namespace_id, read_keys)
        for level, tokens in effective_by_tier.items():
            self.tokens[level].effective_hit += tokens
        for level, tokens in loaded_by_tier.items():
            self.tokens[level].load_success += tokens
        self.recomputed_tokens += recomputed_tokens

    def read_published(self, namespace_id: bytes, keys: Iterable[bytes]) -> None:
        """Chunks of a namespace an engine read out of L2 through the pool's published index (no lease):
        each is a read of its L2 copy (:meth:`read`: a hit, and its most recent use for eviction); a chunk
        gone from L2 meanwhile is left alone."""
        for key in keys:
            cid = chunk_id(namespace_id, key)
            entry = self.visible(cid)
            if entry is not None and entry.has_copy(TierLevel.L2):
                self.read(cid, entry, TierLevel.L2)

    def of_namespace(self, namespace_id: bytes) -> list[tuple[bytes, ChunkEntry]]:
        """The visible chunks of a namespace."""
        return [(c, e) for c, e in self._entries.items() if e.namespace_id == namespace_id and not e.purged]

    def is_pinned(self, entry: ChunkEntry) -> bool:
        """Pinned itself or through its namespace."""
        return entry.pinned or entry.namespace_id in self.pinned_namespaces

    def next_tick(self) -> int:
        """Start a new cache operation: chunks it touches share its tick."""
        self.tick += 1
        return self.tick

    # ------------------------------------------------------------------ changes

    def add_residency(
        self,
        cid: bytes,
        entry: ChunkEntry,
        level: TierLevel,
        now: float,
        tick: int | None = None,
        source: TierLevel | None = None,
    ) -> ChunkEntry:
        """Record that ``level`` now holds a chunk; returns the entry filed under ``cid``.

        ``source``: the tier the copy was made from (announced in the event), None for a store.

        When another entry is filed under ``cid`` already (the chunk was stored anew while a copy of it ran),
        the copy joins that entry.
        """
        entry = self._entries.setdefault(cid, entry)
        if entry.purged:  # (the mover never files a purged chunk's copy; kept true here by construction)
            self._purged.add(cid)
        at = self.tick if tick is None else tick
        entry.add_copy(Residency(level, at, now))
        if source is None:  # a store: the engine computed it, a demand on every tier
            self._space.accessed(cid, entry, self.counters.keys(), at, True)
        elif source > level:  # a promotion: demanded from both tiers
            self._space.accessed(cid, entry, (source, level), at, True)
        else:
            self._space.accessed(cid, entry, (level,), at, False)
        self._space.refresh(cid, entry)
        self._emit(ChunkEvent(EventKind.STORED, level, entry.namespace_id, entry.key, source=source))
        return entry

    def touch(self, cid: bytes, entry: ChunkEntry, level: TierLevel) -> None:
        """A read of ``level``'s copy: it becomes the most recent."""
        entry.copy(level).last_access = self.tick
        self._space.accessed(cid, entry, (level,), self.tick, True)
        self._space.refresh(cid, entry)

    def read(self, cid: bytes, entry: ChunkEntry, level: TierLevel) -> int:
        """A read of ``level``'s copy served to a caller (:meth:`touch` and :meth:`record_hit` in one
        re-ranking: a lease pays this per chunk); returns the chunk's hit count."""
        entry.copy(level).last_access = self.tick
        self._space.accessed(cid, entry, (level,), self.tick, True)
        self.counters[level].hits += 1
        entry.hits += 1
        self._space.refresh(cid, entry)
        return entry.hits

    def record_hit(self, cid: bytes, entry: ChunkEntry, level: TierLevel) -> int:
        """Count a read served by ``level``; returns the chunk's hit count."""
        self.counters[level].hits += 1
        entry.hits += 1
        self._space.refresh(cid, entry)
        return entry.hits

    def hold(self, cid: bytes, entry: ChunkEntry, level: TierLevel) -> None:
        """Protect ``level``'s copy from eviction (a lease, or a copy out of it in flight)."""
        entry.copy(level).holds += 1
        self._space.queue(level).discard(cid)

    def unhold(self, cid: bytes, level: TierLevel) -> bool:
        """End one hold. Returns True when the copy should go now (its chunk was purged, no hold is left)."""
        entry = self._entries.get(cid)
        res = None if entry is None else entry.find_copy(level)
        if entry is None or res is None:
            return False
        res.holds -= 1
        if res.holds == 0:
            self._space.refresh(cid, entry)
        return entry.purged and res.holds == 0

    def remove_residency(self, cid: bytes, entry: ChunkEntry, level: TierLevel, evicted: bool) -> None:
        """Record that ``level`` no longer holds a chunk (the caller deleted it from the tier)."""
        entry.drop_copy(level)
        self._space.forget(cid, entry, level)
        if not entry.tiers and self._entries.get(cid) is entry:
            del self._entries[cid]
            self._purged.discard(cid)
        if evicted:
            self.counters[level].evictions += 1
        if not entry.purged:  # a purge announced every copy's removal already
            self._emit(ChunkEvent(EventKind.REMOVED, level, entry.namespace_id, entry.key, evicted))

    def purge(self, entry: ChunkEntry, cid: bytes) -> list[TierLevel]:
        """Make a chunk invisible; returns the levels whose copies can go now (not held).

        Every copy's removal is announced at once, held ones included: to listeners the chunk is gone now,
        whenever the last hold (a lease, or a copy out of it in flight) lets its bytes go.
        """
        entry.purged = True
        if self._entries.get(cid) is entry:
            self._purged.add(cid)
        self._space.refresh(cid, entry)
        for level in entry.levels:
            self._emit(ChunkEvent(EventKind.REMOVED, level, entry.namespace_id, entry.key, False))
        return [res.level for res in entry.copies() if res.holds == 0]

    # ------------------------------------------------------------------ pins

    def pin(self, cids: Iterable[bytes], pinned: bool) -> int:
        """Pin or unpin chunks; returns how many changed."""
        changed = 0
        for cid in cids:
            entry = self._entries.get(cid)
            if entry is not None and entry.pinned != pinned:
                entry.pinned = pinned
                self._space.refresh(cid, entry)
                changed += 1
        return changed

    def pin_namespace(self, namespace_id: bytes, pinned: bool) -> int:
        """Pin or unpin a namespace; returns how many chunks it has."""
        if pinned:
            self.pinned_namespaces.add(namespace_id)
        else:
            self.pinned_namespaces.discard(namespace_id)
        return sum(1 for e in self._entries.values() if e.namespace_id == namespace_id)
