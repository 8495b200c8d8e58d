"""Chain depths kept by a persistent tier, so that deepest-first eviction survives a restart.

The cache knows each chunk's depth (its position in its hash chain); a tier stores only ids and bytes. A
persistent tier that keeps depths asks the cache for a chunk's depth when it commits the chunk (through a
:data:`DepthSource` the cache binds at start) and stores it with the value in the same transaction; at the
next start the cache reads them back (:meth:`DepthKeeper.stored_depths`). A chunk whose depth was not known
at commit (e.g. stored straight into the persistent tier) comes back with depth 0, as before.

Depths are stored as 4-byte big-endian unsigned integers.

Primitives:
    DepthSource: ``chunk id -> depth or None``.
    DepthKeeper: the protocol of a tier that keeps depths (``bind_depths``, ``stored_depths``).
    pack_depth / unpack_depth: the stored form of a depth.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from typing import Protocol, runtime_checkable

DepthSource = Callable[[bytes], int | None]
"""The depth of a chunk the cache knows, None for one it does not."""

_DEPTH = struct.Struct(">I")
MAX_DEPTH = (1 << 32) - 1
"""The largest depth stored; deeper chunks are stored as this (only their order among the deepest is lost)."""


@runtime_checkable
class DepthKeeper(Protocol):
    """A tier that stores chunk depths with its values."""

    def bind_depths(self, source: DepthSource) -> None:
        """Ask ``source`` for each chunk's depth at commit from now on."""

    def stored_depths(self) -> Mapping[bytes, int]:
        """The depths found when the tier was opened, by chunk id (chunks without one are absent)."""


def pack_depth(depth: int) -> bytes:
    """The stored form of a depth (clamped to ``0 .. MAX_DEPTH``)."""
    return _DEPTH.pack(min(max(depth, 0), MAX_DEPTH))


def unpack_depth(value: memoryview | bytes) -> int | None:
    """The depth of a stored value, or None if it is not one (wrong length)."""
    if len(value) != _DEPTH.size:
        return None
    (depth,) = _DEPTH.unpack(value)
    return int(depth)
