"""What an L3 environment holds, read at open: from the per-chunk records alone, or from every value.

A warm start over a million chunks must not parse a million values one by one in Python. When every
value has a full per-chunk record (:mod:`tiercache.tiers.lmdb_meta`: depth, checksum, sizes; the tier
writes it in the same transaction as the value and deletes it with it, so an environment written by this
version has exactly one record per value), the chunks are indexed from the ``meta`` and ``order`` tables:
one cursor pass over each, parsed in bulk with numpy, no value read (:attr:`ScanKind.RECORDS`). The
values are still checked when they are read: a value damaged or swapped since it was written is a miss
then (counted as a corrupt read and deleted), never served.

Otherwise (an environment written before the records, or before they held the sizes, or whose record
count does not match its value count) every value's header is read and checked as before, malformed
values are dropped at once, and the missing or short records are written, so that the next open is a
record scan (:attr:`ScanKind.VALUES`). Either way stale order and meta records (of values that are gone)
are deleted.

Primitives:
    ScanKind: how the chunks were found (from the records, or from the values).
    FoundChunks: the committed chunks, least recently used first, as parallel lists.
    scan: find the committed chunks of an open environment.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import lmdb
import numpy as np

from tiercache.gcpause import collector_paused
from tiercache.tiers.lmdb_meta import META_BYTES, META_DTYPE, UNKNOWN_DEPTH, ChunkMeta, pack_meta, unpack_meta
from tiercache.tiers.lmdb_order import unpack_seq
from tiercache.tiers.values import HEADER_BYTES, parse_header

if TYPE_CHECKING:
    from tiercache.tiers.lmdb_env import LmdbDatabases

logger = logging.getLogger(__name__)

_SEQ_DTYPE = np.dtype(">u8")


class ScanKind(enum.Enum):
    """How the chunks of an environment were found at open."""

    RECORDS = "records"
    """From the per-chunk records alone (one cursor pass over ``meta`` and ``order``)."""
    VALUES = "values"
    """From every value's header (records missing or incomplete; they are completed)."""


@dataclass(frozen=True, slots=True)
class FoundChunks:
    """The committed chunks of an environment, least recently used first (those without a stored sequence
    number first, in key order): their ids and a numpy table of their sizes and depths.

    Attributes:
        ids: chunk ids.
        table: per chunk, in ``ids`` order: ``depth`` (:data:`UNKNOWN_DEPTH` when none was stored),
            ``stored_bytes`` (header + payload, possibly compressed) and ``nbytes`` (payload once decoded).
        last_seq: the highest stored sequence number (0 if none).
        dropped: malformed values found and deleted (only a value scan finds them).
        kind: how they were found.
    """

    ids: list[bytes]
    table: np.ndarray
    last_seq: int
    dropped: int
    kind: ScanKind

    @property
    def stored_bytes(self) -> list[int]:
        """Bytes of each stored value."""
        return cast("list[int]", self.table["stored_bytes"].tolist())

    @property
    def nbytes(self) -> list[int]:
        """Payload bytes of each once decoded."""
        return cast("list[int]", self.table["nbytes"].tolist())

    @property
    def depths(self) -> list[int | None]:
        """Chain depth of each as stored with it, None when none was."""
        return [None if d == UNKNOWN_DEPTH else d for d in self.table["depth"].tolist()]

    @property
    def used_bytes(self) -> int:
        """Bytes of all the stored values."""
        return int(self.table["stored_bytes"].sum())

    @property
    def payload_bytes(self) -> int:
        """Payload bytes of all the values once decoded."""
        return int(self.table["nbytes"].sum())

    def index(self) -> dict[bytes, tuple[int, int, int | None]]:
        """``chunk id -> (stored bytes, payload bytes, depth or None)`` in use order.

        Equal triples are one shared tuple (a million chunks of a few sizes and depths hold a few hundred
        tuples, not a million); a plain dict, which keeps insertion order, is half the memory of an
        ``OrderedDict``.
        """
        if not self.ids:
            return {}
        with collector_paused():
            # One integer code per chunk for its triple (from the distinct values of each column: 1-D
            # integer sorts, fast), then one shared tuple per distinct code.
            columns = [
                np.unique(self.table[f], return_inverse=True) for f in ("stored_bytes", "nbytes", "depth")
            ]
            code = np.zeros(len(self.ids), dtype=np.int64)
            for values, inverse in columns:
                code = code * len(values) + inverse.reshape(-1)
            distinct, which = np.unique(code, return_inverse=True)
            shared = np.empty(len(distinct), dtype=object)
            for i, c in enumerate(distinct.tolist()):
                parts = []
                for values, _ in reversed(columns):
                    c, at = divmod(c, len(values))
                    parts.append(int(values[at]))
                depth, nbytes, stored = parts
                shared[i] = (stored, nbytes, None if depth == UNKNOWN_DEPTH else depth)
            return dict(zip(self.ids, shared[which.reshape(-1)].tolist()))


def scan(env: lmdb.Environment, dbs: LmdbDatabases, path: str) -> FoundChunks:
    """The committed chunks of ``env``: from the records when they are complete, else from the values.

    Stale records are deleted and missing ones written (a map too full for that is logged, not raised).
    """
    with collector_paused():
        return _scan(env, dbs, path)


def _scan(env: lmdb.Environment, dbs: LmdbDatabases, path: str) -> FoundChunks:
    with env.begin() as txn:
        found = _from_records(txn, dbs)
    if found is not None:
        ids, table, stale_order = found
        stale_meta: list[bytes] = []
        fill: dict[bytes, bytes] = {}
        bad: list[bytes] = []
        kind = ScanKind.RECORDS
    else:
        with env.begin(buffers=True) as txn:  # values are not copied out of the map
            ids, table, stale_meta, fill, bad = _from_values(txn, dbs)
        with env.begin() as txn:
            stale_order = _seqs(txn, dbs, ids, table)
        kind = ScanKind.VALUES
    if bad or stale_order or stale_meta or fill:
        try:
            with env.begin(write=True) as txn:
                for cid in bad:
                    txn.delete(cid, db=dbs.values)
                    txn.delete(cid, db=dbs.order)
                    txn.delete(cid, db=dbs.meta)
                for cid in stale_order:
                    txn.delete(cid, db=dbs.order)
                for cid in stale_meta:
                    txn.delete(cid, db=dbs.meta)
                for cid, record in fill.items():
                    txn.put(cid, record, db=dbs.meta)
        except lmdb.MapFullError:
            logger.exception("L3 at %s: map full while dropping malformed values or writing records", path)
    # Chunks without a recorded sequence number go first (key order among them: ``ids`` is in key order).
    order = np.lexsort((table["seq"], table["has_seq"]))
    by_id = np.empty(len(ids), dtype=object)
    by_id[:] = ids
    logger.info("L3 at %s: %d chunks found from the %s", path, len(ids), kind.value)
    return FoundChunks(
        ids=cast("list[bytes]", by_id[order].tolist()),
        table=table[["depth", "stored_bytes", "nbytes"]][order],
        last_seq=int(table["seq"].max()) if len(ids) else 0,
        dropped=len(bad),
        kind=kind,
    )


_TABLE = np.dtype(
    [("depth", "<u4"), ("stored_bytes", "<u8"), ("nbytes", "<u8"), ("seq", "<u8"), ("has_seq", "?")]
)
"""What the scan knows of each chunk, in key order."""


def _pairs(txn: lmdb.Transaction, db: lmdb._Database) -> list[tuple[bytes, bytes]]:
    """Every ``(key, value)`` of ``db`` in key order, as ``bytes`` (``txn`` is opened without buffers)."""
    return cast("list[tuple[bytes, bytes]]", list(txn.cursor(db=db).iternext()))


def _seqs(txn: lmdb.Transaction, dbs: LmdbDatabases, ids: Sequence[bytes], table: np.ndarray) -> list[bytes]:
    """Fill ``table``'s sequence numbers from the ``order`` table; returns its stale keys.

    The tier writes a chunk's order record with its value and deletes them together, so when the table
    holds one record per chunk its records are the chunks' own, in the same key order: only their values
    are read. Otherwise each record is matched by key (and those of no chunk are stale).
    """
    if txn.stat(dbs.order)["entries"] == len(ids):
        values = cast("list[bytes]", list(txn.cursor(db=dbs.order).iternext(keys=False, values=True)))
        if not ids or set(map(len, values)) == {_SEQ_DTYPE.itemsize}:
            table["seq"] = np.frombuffer(b"".join(values), dtype=_SEQ_DTYPE) if ids else 0
            table["has_seq"] = True
            return []
    position = {cid: i for i, cid in enumerate(ids)}
    stale: list[bytes] = []
    for key, value in _pairs(txn, dbs.order):
        i = position.get(key)
        seq = None if i is None else unpack_seq(value)
        if i is None or seq is None:
            stale.append(key)
        else:
            table["seq"][i] = seq
            table["has_seq"][i] = True
    return stale


def _from_records(
    txn: lmdb.Transaction, dbs: LmdbDatabases
) -> tuple[Sequence[bytes], np.ndarray, list[bytes]] | None:
    """Chunk ids (key order), their table and stale order keys, from complete records; None if they are not."""
    if txn.stat(dbs.meta)["entries"] != txn.stat(dbs.values)["entries"]:
        return None
    # Keys and values in two C-speed passes (no pair per chunk, no transposition of a million pairs).
    ids = cast("list[bytes]", list(txn.cursor(db=dbs.meta).iternext(keys=True, values=False)))
    records = cast("list[bytes]", list(txn.cursor(db=dbs.meta).iternext(keys=False, values=True)))
    if records and set(map(len, records)) != {META_BYTES}:
        return None  # short records of an earlier version, or damage: the values say more
    parsed = np.frombuffer(b"".join(records), dtype=META_DTYPE) if records else np.zeros(0, META_DTYPE)
    if bool(np.any(parsed["nbytes"] == 0)) or bool(np.any(parsed["stored_bytes"] <= HEADER_BYTES)):
        return None
    table = np.zeros(len(ids), dtype=_TABLE)
    table["depth"] = parsed["depth"]
    table["stored_bytes"] = parsed["stored_bytes"]
    table["nbytes"] = parsed["nbytes"]
    return ids, table, _seqs(txn, dbs, ids, table)


def _from_values(
    txn: lmdb.Transaction, dbs: LmdbDatabases
) -> tuple[Sequence[bytes], np.ndarray, list[bytes], dict[bytes, bytes], list[bytes]]:
    """Chunk ids (key order), their table (no sequence numbers yet), stale meta keys, records to write and
    malformed ids, from every value's header (``txn`` is opened with buffers)."""
    sizes: dict[bytes, tuple[int, int, int]] = {}  # id -> stored bytes, payload bytes, header checksum
    bad: list[bytes] = []
    for view, value in txn.cursor(db=dbs.values).iternext():
        key = bytes(view)
        header = parse_header(memoryview(value))
        if isinstance(header, str):
            logger.warning("L3 value %s is malformed (%s); dropping it", key.hex(), header)
            bad.append(key)
        else:
            sizes[key] = (len(value), header.raw_len, header.checksum)
    ids = tuple(sizes)
    table = np.zeros(len(ids), dtype=_TABLE)
    table["depth"] = UNKNOWN_DEPTH
    if ids:
        table["stored_bytes"] = [s[0] for s in sizes.values()]
        table["nbytes"] = [s[1] for s in sizes.values()]
    position = {cid: i for i, cid in enumerate(ids)}
    stale_meta: list[bytes] = []
    fill: dict[bytes, bytes] = {}
    seen: set[bytes] = set()
    for view, value in txn.cursor(db=dbs.meta).iternext():
        key = bytes(view)
        i = position.get(key)
        meta = unpack_meta(value) if i is not None else None
        if i is None or meta is None:
            stale_meta.append(key)
            continue
        seen.add(key)
        if meta.depth is not None:
            table["depth"][i] = meta.depth
        if meta.stored_bytes is None:  # a short record: complete it, keeping the checksum written here
            stored, nbytes, _ = sizes[key]
            fill[key] = pack_meta(ChunkMeta(meta.depth, meta.checksum, stored, nbytes))
    for cid, (stored, nbytes, check) in sizes.items():
        if cid not in seen:  # no record (an older environment): the value as found is the one written
            fill[cid] = pack_meta(ChunkMeta(None, check, stored, nbytes))
    return ids, table, stale_meta, fill, bad
