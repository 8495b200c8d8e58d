"""Chain depths kept by a persistent tier, so that deepest-first eviction survives a restart.

The cache knows each chunk's depth (its position in its hash chain); a tier stores only ids and bytes. A
persistent tier that keeps depths asks the cache for a chunk's depth when it commits the chunk (through a
:data:`DepthSource` the cache binds at start) and stores it with the value in the same transaction; at the
next start the cache reads them back with the chunks (:meth:`DepthKeeper.depth_entries`, in one pass, as
columns: a warm start over a million chunks builds three lists, not a million tuples). A chunk whose depth
was not known at commit (e.g. stored straight into the persistent tier) comes back with depth 0, as before.

Primitives:
    DepthSource: ``chunk id -> depth or None``.
    HeldChunks: the chunks a tier holds, as parallel columns (ids, payload sizes, stored depths).
    DepthKeeper: the protocol of a tier that keeps depths (``bind_depths``, ``stored_depths``,
        ``depth_entries``).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

_NBYTES, _DEPTH = operator.itemgetter(1), operator.itemgetter(2)

DepthSource = Callable[[bytes], int | None]
"""The depth of a chunk the cache knows, None for one it does not."""


@dataclass(frozen=True, slots=True)
class HeldChunks:
    """The chunks a tier holds, in its ``entries()`` order, as parallel columns of equal length.

    Attributes:
        ids: chunk ids.
        nbytes: payload bytes of each.
        depths: the chain depth stored with each, None where none was (or the tier keeps none).
    """

    ids: list[bytes]
    nbytes: list[int]
    depths: list[int | None]

    def __post_init__(self) -> None:
        if not len(self.ids) == len(self.nbytes) == len(self.depths):
            raise ValueError("ids, nbytes and depths must be of one length")

    @classmethod
    def of_index(cls, index: Mapping[bytes, tuple[int, int, int | None]]) -> HeldChunks:
        """The columns of an index ``chunk id -> (stored bytes, payload bytes, depth or None)``, in its order
        (three C-speed passes: no tuple per chunk)."""
        values = list(index.values())
        return cls(list(index), list(map(_NBYTES, values)), list(map(_DEPTH, values)))


@runtime_checkable
class DepthKeeper(Protocol):
    """A tier that stores chunk depths with its values."""

    def bind_depths(self, source: DepthSource) -> None:
        """Ask ``source`` for each chunk's depth at commit from now on."""

    def stored_depths(self) -> Mapping[bytes, int]:
        """The depths stored with the chunks held, by chunk id (chunks without one are absent)."""

    def depth_entries(self) -> HeldChunks:
        """The chunks held, with their stored depths, in ``entries()`` order."""
