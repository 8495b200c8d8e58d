"""The L2 index a pool publishes in its own shared memory: which chunks its pages hold, for engines to read.

An engine that asks the daemon "how much of this prompt do you hold?" pays a round trip, and under
``vllm serve`` on a busy host that round trip is often later than the scheduler can wait (a request then
waits a whole step). The daemon therefore also writes, for each L2 pool, a table of the pool's committed
chunks into the pool's own segment, after its pages: an engine that maps the pool reads it with no call at
all, copies a chunk's pages, and then checks that the chunk was neither dropped nor replaced meanwhile.

The index is a :data:`HEADER_BYTES`-byte header, whose first eight bytes are the daemon's heartbeat (its
``CLOCK_MONOTONIC`` in ns, written every :data:`BEAT_S`; 0: the daemon closed the index), then an
open-addressing hash table of :data:`ENTRY_BYTES`-byte entries (``entries`` of them, the count on the wire),
each guarded by a sequence number (a seqlock: odd while the daemon writes the entry, bumped by two for each
change):

====== ===== ===================================================================
offset bytes field
====== ===== ===================================================================
0      8     sequence number (u64, little-endian)
8      4     state: 0 never used, 1 live, 2 withdrawn (a deleted entry; probing goes on past it)
12     4     the chunk's bytes
16     8     the chunk's first page (its ``slot``)
24     8     unused (zero)
32     32    the chunk key
====== ===== ===================================================================

A reader trusts no index whose heartbeat is older than :data:`STALE_S`: a daemon that was killed withdraws
nothing, and its old segment stays mapped in the engines (its bytes are the chunks' own, but the daemon that
replaced it knows nothing of them), so engines go back to asking, and meet the new daemon.

A key's entry is at most :data:`MAX_PROBES` places from ``hash(key) % entries`` (the key is already a
cryptographic hash: its first eight bytes are the hash). The daemon writes an entry when a chunk is
committed to the pool and withdraws it (its sequence number moves on) *before* the chunk's pages are freed,
under the tier's lock; so a reader that finds the same even sequence number after its copy as before it
copied bytes that were the chunk's for the whole copy. A chunk that finds no free place within
:data:`MAX_PROBES` is not published: engines ask the daemon for it, as before.

Who can do what: a pool's table lists only the chunks of the pool's tenant (a tenant's pool is handed only to
that tenant's engines), and the daemon only ever writes it: its own copy of the table (:class:`IndexWriter`)
decides where entries go, so an engine scribbling over its own mapping damages only its own view of its own
chunks (a garbled entry names pages out of range or the wrong size: a miss), never the daemon.

Ordering: the reader reads the sequence number, the entry, then the sequence number again, and the sequence
number again after its copy; the writer writes the number, the entry, the number. Each access is a separate
C call (no compiler reordering across them), and x86-64 keeps loads in order with loads and stores with
stores, which is all a seqlock needs. On a weaker memory model (ARM) the reader would need fences.

Primitives:
    HEADER_BYTES, ENTRY_BYTES: bytes of the header and of each entry; index_bytes: of an index.
    BEAT_S, STALE_S: how often the daemon beats, and after how long without a beat readers stop trusting.
    MAX_PROBES: how far from its home place an entry may be.
    index_entries: the table size for a pool of so many pages.
    IndexWriter: the daemon's side (``publish``, ``withdraw``, ``close``).
    Published: where a chunk was found, and the sequence number to check after the copy.
    IndexReader: the engine's side (``find``, ``prefix``, ``still``, ``close``).
"""

from __future__ import annotations

import contextlib
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tiercache.errors import InvalidArgumentError
from tiercache.keys import KEY_BYTES

HEADER_BYTES = 64
"""Bytes of the index's header (the heartbeat, then zeros)."""
ENTRY_BYTES = 64
"""Bytes per entry (the layout is in the module docstring)."""
BEAT_S = 0.1
"""How often the daemon writes its heartbeat into every index."""
STALE_S = 1.0
"""An index whose heartbeat is older than this is not read (the daemon died or hangs)."""
MAX_PROBES = 8
"""An entry lives at most this many places from its home place (``hash(key) % entries``)."""

_NEVER, _LIVE, _WITHDRAWN = 0, 1, 2
_SEQ = struct.Struct("<Q")
_BODY = struct.Struct("<IIQ8x32s")  # state, nbytes, slot, (unused), key


def index_entries(num_pages: int) -> int:
    """Entries of the table of a pool of ``num_pages`` pages: twice the most chunks it can hold, so that at
    most half of the table is live and probes stay short."""
    return max(16, 2 * num_pages)


def index_bytes(entries: int) -> int:
    """Bytes of an index of ``entries`` entries: its header and entries, in whole 4 KiB pages (so that a
    segment of pages and an index is still a whole number of the system's pages)."""
    return -(-(HEADER_BYTES + entries * ENTRY_BYTES) // 4096) * 4096


def _home(key: bytes, entries: int) -> int:
    return int.from_bytes(key[:8], "little") % entries


def _at(place: int) -> int:
    return HEADER_BYTES + place * ENTRY_BYTES


def _check(buffer: memoryview, entries: int) -> None:
    if entries <= 0 or len(buffer) < index_bytes(entries):
        raise InvalidArgumentError(
            "index_entries", f"an index of {entries} entries does not fit {len(buffer)} bytes"
        )


class IndexWriter:
    """The daemon's side of one pool's table: it alone decides where entries go (from its own copy of the
    table, never from the shared bytes) and writes them. Not thread-safe: the tier calls it under its lock."""

    def __init__(self, buffer: memoryview, entries: int) -> None:
        """Args: buffer: the index's bytes (:func:`index_bytes` at least, zero: every entry unused);
        entries: the table's size."""
        _check(buffer, entries)
        self.entries = entries
        self._buffer = buffer
        self._at: dict[bytes, int] = {}  # live key -> place
        self._keys: dict[int, bytes] = {}  # place -> live key
        self._seqs: dict[int, int] = {}  # place -> sequence number (absent: 0, never used)
        self._closed = False
        self.beat()

    def beat(self) -> None:
        """Write the heartbeat (readers trust the index for :data:`STALE_S` after it)."""
        if not self._closed:
            _SEQ.pack_into(self._buffer, 0, time.monotonic_ns())

    @property
    def live(self) -> int:
        """Entries published and not withdrawn."""
        return len(self._at)

    def publish(self, key: bytes, slot: int, nbytes: int) -> bool:
        """Publish chunk ``key`` at pages from ``slot`` (``nbytes`` long); False when no place within
        :data:`MAX_PROBES` of its home is free (the chunk stays unpublished: engines ask for it)."""
        if self._closed:
            return False
        self.withdraw(key)
        home = _home(key, self.entries)
        for step in range(MAX_PROBES):
            place = (home + step) % self.entries
            if place not in self._keys:
                self._write(place, _LIVE, nbytes, slot, key)
                self._at[key], self._keys[place] = place, key
                return True
        return False

    def withdraw(self, key: bytes) -> bool:
        """Withdraw ``key``'s entry, if published (before its pages may be reused)."""
        place = self._at.pop(key, None)
        if place is None:
            return False
        del self._keys[place]
        self._write(place, _WITHDRAWN, 0, 0, bytes(KEY_BYTES))
        return True

    def close(self) -> None:
        """Withdraw every entry and let go of the table's memory (idempotent; publishes nothing after)."""
        if self._closed:
            return
        for key in list(self._at):
            self.withdraw(key)
        _SEQ.pack_into(self._buffer, 0, 0)  # closed: readers stop at once
        self._closed = True
        self._buffer.release()

    def _write(self, place: int, state: int, nbytes: int, slot: int, key: bytes) -> None:
        offset = _at(place)
        seq = self._seqs.get(place, 0)
        _SEQ.pack_into(self._buffer, offset, seq + 1)  # odd: readers of this entry see a miss
        _BODY.pack_into(self._buffer, offset + 8, state, nbytes, slot, key)
        _SEQ.pack_into(self._buffer, offset, seq + 2)
        self._seqs[place] = seq + 2


@dataclass(frozen=True, slots=True)
class Published:
    """Where a chunk was found in a pool's table.

    Attributes:
        place: the entry's place in the table.
        seq: its sequence number when read (the copy holds when it is still this afterwards).
        slot: the chunk's first page.
        nbytes: the chunk's bytes.
        key: the chunk's key.
    """

    place: int
    seq: int
    slot: int
    nbytes: int
    key: bytes


class IndexReader:
    """An engine's side of one pool's table (a read-only use of the mapped segment's tail)."""

    def __init__(
        self,
        buffer: memoryview,
        entries: int,
        num_pages: int,
        page_bytes: int,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        """Args:
        buffer: the index's bytes in the mapped segment.
        entries: the table's size (from the daemon's registration answer).
        num_pages, page_bytes: the pool's pages (an entry outside them is a miss).
        clock: this host's ``CLOCK_MONOTONIC`` in ns (the daemon's heartbeat clock).
        """
        _check(buffer, entries)
        self.entries = entries
        self._clock = clock
        self._buffer = buffer
        self._pool_bytes = num_pages * page_bytes
        self._page_bytes = page_bytes

    def close(self) -> None:
        """Let go of the table's memory (the mapping is being unmapped); everything is a miss after. A
        read in flight in another thread keeps the memory until it ends (it is never unmapped under it)."""
        with contextlib.suppress(BufferError):  # a read in flight: the view goes with this reader
            self._buffer.release()

    def find(self, key: bytes, nbytes: int) -> Published | None:
        """Where chunk ``key`` of ``nbytes`` bytes is, as published now; None: not published (or being
        changed this instant, or not ``nbytes`` long, or the reader closed)."""
        try:
            return self._find(key, nbytes)
        except ValueError:  # closed (released) meanwhile
            return None

    def _entry(self, place: int) -> tuple[int, int, int, int, bytes] | None:
        """A consistent snapshot of an entry: (sequence number, state, bytes, slot, key); None while the
        daemon writes it (an odd number, or one that moved during the read). Raises ValueError once closed."""
        offset = _at(place)
        (seq,) = _SEQ.unpack_from(self._buffer, offset)
        if seq & 1:
            return None
        state, size, slot, key = _BODY.unpack_from(self._buffer, offset + 8)
        if _SEQ.unpack_from(self._buffer, offset)[0] != seq:
            return None
        return seq, state, size, slot, key

    def _find(self, key: bytes, nbytes: int) -> Published | None:
        home = _home(key, self.entries)
        for step in range(MAX_PROBES):
            place = (home + step) % self.entries
            entry = self._entry(place)
            if entry is None or entry[1] == _NEVER:
                return None  # being written (a miss now), or the end of the probe
            seq, state, size, slot, found = entry
            if state == _LIVE and found == key:
                if size != nbytes or slot * self._page_bytes + size > self._pool_bytes:
                    return None  # not a chunk of this layout, or garbled
                return Published(place, seq, slot, size, key)
        return None

    def alive(self) -> bool:
        """Whether the daemon beat within :data:`STALE_S` (and did not close the index)."""
        try:
            (beat,) = _SEQ.unpack_from(self._buffer, 0)
        except ValueError:  # closed
            return False
        return bool(beat) and self._clock() - beat < STALE_S * 1e9

    def prefix(self, keys: Sequence[bytes], nbytes: int) -> list[Published]:
        """The published chunks of ``keys`` in order, up to the first one that is not (none while the
        index is not :meth:`alive`)."""
        found: list[Published] = []
        if not self.alive():
            return found
        for key in keys:
            where = self.find(key, nbytes)
            if where is None:
                break
            found.append(where)
        return found

    def still(self, where: Published) -> bool:
        """Whether the entry found is unchanged: the chunk's pages held it all along since ``find`` (its
        sequence number, key and pages are still those found: a table of another daemon that happens to
        have the same number there does not pass)."""
        try:
            entry = self._entry(where.place)
        except ValueError:  # closed: the mapping is going, nothing copied from it counts
            return False
        return entry == (where.seq, _LIVE, where.nbytes, where.slot, where.key)
