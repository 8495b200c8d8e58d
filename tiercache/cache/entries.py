"""One indexed chunk and its copies, in as few Python objects as a million of them allow.

A full index is a million :class:`ChunkEntry` objects or more, nearly all with a single copy (one tier
holds them). A per-entry ``dict`` of copies cost 224 bytes (the dict and its key table) on top of the
copy itself, and a lookup that tested ``level in entry.res`` touched two more cold objects per chunk (at
a million chunks each touch is a cache and TLB miss: 3 to 10 µs of a cold 64-chunk lookup). So an entry
keeps:

- ``tiers``, an ``int`` bit set of the tiers holding a copy (bit ``1 << level``): a lookup tests it at C
  speed without leaving the entry, and the fastest and slowest holders are table look-ups;
- its copies as one :class:`Residency` (the usual case: no container at all) or, for a chunk held by
  several tiers, a tuple of them in ascending level order (rebuilt on the rare add or drop).

Every read and change of the copies goes through the entry's methods, so the two forms never leak out.

Primitives:
    Residency: one tier's copy of a chunk (its level, last access, arrival time and holds).
    ChunkEntry: a chunk the cache knows: has_copy, copy, find_copy, copies, levels, fastest, slowest,
        add_copy, drop_copy.
    tier_bit: the bit of a level in ``ChunkEntry.tiers``.
"""

from __future__ import annotations

from dataclasses import dataclass

from tiercache.keys import NAMESPACE_ID_BYTES
from tiercache.tiers.base import TierLevel


def tier_bit(level: TierLevel) -> int:
    """The bit of ``level`` in :attr:`ChunkEntry.tiers`."""
    return 1 << level


_LEVELS: tuple[tuple[TierLevel, ...], ...] = tuple(
    tuple(level for level in sorted(TierLevel) if mask & tier_bit(level))
    for mask in range(2 << max(TierLevel))
)
"""The levels of each bit set, ascending (indexed by the bit set)."""


@dataclass(slots=True)
class Residency:
    """One tier's copy of a chunk.

    Attributes:
        level: the tier holding the copy.
        last_access: tick of the last store or read of this copy.
        stored_at: clock time the copy arrived (minimum residency is measured from it).
        holds: leases and in-flight copies out of this copy; a held copy is not evicted.
    """

    level: TierLevel
    last_access: int
    stored_at: float
    holds: int = 0


@dataclass(slots=True)
class ChunkEntry:
    """A chunk the cache knows, and its copies.

    ``cid`` is the chunk id itself (the object the index files it under: no second copy of the key);
    ``namespace_id`` is its first :data:`NAMESPACE_ID_BYTES` bytes, one object shared by the chunks of
    a namespace where the caller has one (pinned-namespace checks hash it on every victim search).
    ``tiers`` and ``held`` are the copies (see the module docstring); change them only through
    :meth:`add_copy` and :meth:`drop_copy`.
    """

    namespace_id: bytes
    cid: bytes
    depth: int
    nbytes: int
    tiers: int = 0
    held: Residency | tuple[Residency, ...] = ()
    hits: int = 0
    pinned: bool = False
    purged: bool = False  # invisible; its held copies go when their holds end

    @property
    def key(self) -> bytes:
        """The chunk key (the id without its namespace id)."""
        return self.cid[NAMESPACE_ID_BYTES:]

    def has_copy(self, level: TierLevel) -> bool:
        """Whether ``level`` holds a copy."""
        return bool(self.tiers & (1 << level))

    def copies(self) -> tuple[Residency, ...]:
        """Every copy, fastest tier first."""
        held = self.held
        return held if isinstance(held, tuple) else (held,)

    def find_copy(self, level: TierLevel) -> Residency | None:
        """``level``'s copy, or None when it holds none."""
        if not self.tiers & (1 << level):
            return None
        held = self.held
        if isinstance(held, Residency):
            return held
        return next(res for res in held if res.level == level)

    def copy(self, level: TierLevel) -> Residency:
        """``level``'s copy.

        Raises:
            KeyError: ``level`` holds no copy.
        """
        res = self.find_copy(level)
        if res is None:
            raise KeyError(level)
        return res

    @property
    def levels(self) -> tuple[TierLevel, ...]:
        """The tiers holding a copy, fastest first."""
        return _LEVELS[self.tiers]

    @property
    def fastest(self) -> TierLevel:
        """The fastest tier holding a copy.

        Raises:
            IndexError: no tier holds one.
        """
        return _LEVELS[self.tiers][0]

    @property
    def slowest(self) -> TierLevel:
        """The slowest tier holding a copy.

        Raises:
            IndexError: no tier holds one.
        """
        return _LEVELS[self.tiers][-1]

    def add_copy(self, res: Residency) -> None:
        """File ``res`` as its tier's copy (replacing that tier's previous copy, if any)."""
        bit = 1 << res.level
        if not self.tiers or self.tiers == bit:
            self.held = res
        else:
            others = [r for r in self.copies() if r.level != res.level]
            self.held = tuple(sorted([*others, res], key=_level_of))
        self.tiers |= bit

    def drop_copy(self, level: TierLevel) -> None:
        """Forget ``level``'s copy.

        Raises:
            KeyError: ``level`` holds no copy.
        """
        if not self.tiers & (1 << level):
            raise KeyError(level)
        self.tiers &= ~(1 << level)
        rest = tuple(r for r in self.copies() if r.level != level)
        self.held = rest[0] if len(rest) == 1 else rest


def _level_of(res: Residency) -> TierLevel:
    return res.level
