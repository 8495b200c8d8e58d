"""Chain depths kept by a persistent tier, so that deepest-first eviction survives a restart.

The cache knows each chunk's depth (its position in its hash chain); a tier stores only ids and bytes. A
persistent tier that keeps depths asks the cache for a chunk's depth when it commits the chunk (through a
:data:`DepthSource` the cache binds at start) and stores it with the value in the same transaction; at the
next start the cache reads them back with the chunks (:meth:`DepthKeeper.depth_entries`, in one pass). A chunk whose depth was not known
at commit (e.g. stored straight into the persistent tier) comes back with depth 0, as before.

Primitives:
    DepthSource: ``chunk id -> depth or None``.
    DepthKeeper: the protocol of a tier that keeps depths (``bind_depths``, ``stored_depths``,
        ``depth_entries``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol, runtime_checkable

DepthSource = Callable[[bytes], int | None]
"""The depth of a chunk the cache knows, None for one it does not."""


@runtime_checkable
class DepthKeeper(Protocol):
    """A tier that stores chunk depths with its values."""

    def bind_depths(self, source: DepthSource) -> None:
        """Ask ``source`` for each chunk's depth at commit from now on."""

    def stored_depths(self) -> Mapping[bytes, int]:
        """The depths stored with the chunks held, by chunk id (chunks without one are absent)."""

    def depth_entries(self) -> list[tuple[bytes, int, int | None]]:
        """The chunks held as ``(chunk_id, nbytes, stored depth or None)``, in ``entries()`` order."""
