"""Persistence of the L3 tier's access order: sequence numbers of chunk uses in LMDB's ``order`` database.

Each commit or successful read of a chunk gives it the next sequence number. A commit writes its chunks'
numbers in its own transaction; reads only record theirs as pending, and the pending numbers are written
(flushed) every :data:`ORDER_FLUSH_READS` reads, on ``flush()`` and at close, or with the next commit. A
process that dies loses at most the reads since the last flush; a restart sorts the chunks by their stored
numbers (those without one first).

Values are 8-byte big-endian unsigned integers.

Primitives:
    ORDER_FLUSH_READS: reads after which the pending order is due for a flush.
    pack_seq / unpack_seq: the stored form of a sequence number.
    AccessOrder: the sequence counter and the pending (not yet stored) numbers.
"""

from __future__ import annotations

import struct
from collections.abc import Container, Mapping

ORDER_FLUSH_READS = 256
"""Successful chunk reads after which the access order is written to the ``order`` database."""
_SEQ = struct.Struct(">Q")


def pack_seq(seq: int) -> bytes:
    """The stored form of a sequence number."""
    return _SEQ.pack(seq)


def unpack_seq(value: memoryview | bytes) -> int | None:
    """The sequence number of a stored value, or None if it is not one (wrong length)."""
    if len(value) != _SEQ.size:
        return None
    (seq,) = _SEQ.unpack(value)
    return int(seq)


class AccessOrder:
    """The last sequence number given out and the numbers not yet written to the ``order`` database.

    Not thread-safe: the tier calls it with its lock held.
    """

    def __init__(self, last_seq: int = 0) -> None:
        """Args: last_seq: the highest number already stored (numbering continues after it)."""
        self._seq = last_seq
        self._pending: dict[bytes, int] = {}
        self._reads = 0

    @property
    def last_seq(self) -> int:
        """The highest number given out so far."""
        return self._seq

    def allocate(self, n: int) -> int:
        """Give out ``n`` consecutive numbers (a commit writes them itself); returns the first."""
        first = self._seq + 1
        self._seq += n
        return first

    def used(self, chunk_id: bytes) -> None:
        """Give ``chunk_id`` the next number, pending until the next flush or commit."""
        self._seq += 1
        self._pending[chunk_id] = self._seq

    def read(self, chunk_id: bytes) -> None:
        """A successful read of ``chunk_id``: :meth:`used`, counted towards the next flush."""
        self.used(chunk_id)
        self._reads += 1

    @property
    def flush_due(self) -> bool:
        """Whether :data:`ORDER_FLUSH_READS` reads were recorded since the last :meth:`take`."""
        return self._reads >= ORDER_FLUSH_READS

    def take(self) -> dict[bytes, int]:
        """Detach the pending numbers (to write them) and restart the read count."""
        pending, self._pending = self._pending, {}
        self._reads = 0
        return pending

    def restore(self, pending: Mapping[bytes, int], live: Container[bytes]) -> None:
        """Put back numbers that failed to land, for chunks still ``live``; newer pending numbers win."""
        for cid, seq in pending.items():
            if cid in live and cid not in self._pending:
                self._pending[cid] = seq

    def forget(self, chunk_id: bytes) -> None:
        """Drop the pending number of a deleted chunk."""
        self._pending.pop(chunk_id, None)
