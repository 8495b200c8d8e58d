"""Opening the L3 tier's LMDB environment: create or reopen it, scan what it holds, recover from damage.

One environment (a directory) holds three sub-databases: ``values`` (chunk id -> stored value, see
:mod:`tiercache.tiers.values`), ``order`` (chunk id -> access sequence number, see
:mod:`tiercache.tiers.lmdb_order`) and ``meta`` (chunk id -> chain depth and value checksum, see
:mod:`tiercache.tiers.lmdb_meta`; an environment written before it had one simply has no records).
Opening it finds the committed chunks (from the per-chunk records
alone when they are complete, else by checking every value's header: :mod:`tiercache.tiers.lmdb_scan`),
drops stale records and sorts the chunks by their last use, so that a restart finds the index and the order
the last process left. It also allocates the disk blocks of the
capacity up front, never more than three quarters of the disk's room (see :func:`open_environment`).

An environment whose files are damaged (an OS crash without ``durable`` may do that) is moved aside to
``<path>.damaged-<time>`` and started empty when recovery is allowed: it is a cache.

Primitives:
    DAMAGE: the LMDB errors that mean damaged files.
    PREALLOCATE_SHARE: the most of the disk's room L3 preallocates.
    LmdbDatabases: the three databases of an open environment.
    OpenedEnvironment: the open environment, its databases and what they hold.
    open_environment: open (or create) and scan, failing on damage.
    open_or_recover: the same, moving a damaged environment aside and starting empty when allowed.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from dataclasses import dataclass

import lmdb

from tiercache.errors import InvalidArgumentError
from tiercache.tiers.lmdb_scan import FoundChunks, scan

logger = logging.getLogger(__name__)

VALUES_DB = b"values"
"""Sub-database of the stored values."""
ORDER_DB = b"order"
"""Sub-database of the access sequence numbers."""
META_DB = b"meta"
"""Sub-database of the per-chunk records (depth, value checksum)."""
DAMAGE = (lmdb.CorruptedError, lmdb.InvalidError, lmdb.PageNotFoundError, lmdb.VersionMismatchError)
"""LMDB errors that mean the environment's files are damaged (e.g. by an OS crash without ``durable``)."""
PREALLOCATE_SHARE = 0.75
"""The most of the disk's room (the data file's blocks plus the free space) L3 preallocates: a disk with less
gets no preallocation and a smaller L3 (see :meth:`~tiercache.tiers.lmdb_config.LmdbTierConfig.fitted_capacity`),
and the rest of the host keeps the other quarter."""


@dataclass(frozen=True, slots=True)
class LmdbDatabases:
    """The databases of an open environment.

    Attributes:
        values: the ``values`` database.
        order: the ``order`` database.
        meta: the ``meta`` database.
    """

    values: lmdb._Database
    order: lmdb._Database
    meta: lmdb._Database


@dataclass(frozen=True, slots=True)
class OpenedEnvironment:
    """An open environment and what it holds.

    Attributes:
        env: the environment (the caller closes it).
        dbs: its databases.
        max_key_bytes: LMDB's largest key.
        found: the committed chunks, least recently used first, the last sequence number and the malformed
            values dropped.
        writemap: whether writes go through the shared writable map (only when it is backed by disk).
        disk_room_bytes: when the filesystem could not hold the preallocation, the bytes the data file can
            still grow to (its allocated blocks plus the free space); None otherwise.
    """

    env: lmdb.Environment
    dbs: LmdbDatabases
    max_key_bytes: int
    found: FoundChunks
    writemap: bool = False
    disk_room_bytes: int | None = None


def _open(path: str, map_size_bytes: int, durable: bool, writemap: bool) -> lmdb.Environment:
    try:
        return lmdb.open(
            path,
            map_size=map_size_bytes,
            subdir=True,
            max_dbs=3,
            sync=durable,
            metasync=durable,
            readahead=False,
            meminit=False,
            writemap=writemap,
            lock=True,
            create=True,
        )
    except DAMAGE:
        raise
    except lmdb.Error as exc:
        raise InvalidArgumentError("path", f"cannot open LMDB environment at {path!r}: {exc}") from exc


def open_environment(
    path: str, *, map_size_bytes: int, durable: bool, preallocate_bytes: int
) -> OpenedEnvironment:
    """Open (or create) the environment at ``path``, scan it and reserve ``preallocate_bytes`` of disk.

    Writes go through a shared writable map (``writemap``, which saves a copy per store) only when the
    whole map is backed by allocated disk blocks: on a sparse region a full disk surfaces as SIGBUS in the
    middle of a store. Otherwise (a map larger than the preallocation, the default; a filesystem without
    ``fallocate``; a disk too small for the preallocation) LMDB writes with ``pwrite``, and a full disk is
    an error of that commit (the store fails cleanly, reads go on). A disk too small for the preallocation
    is reported in ``disk_room_bytes`` so that the tier can shrink to it.

    Args:
        path: directory of the environment (created if missing).
        map_size_bytes: LMDB map size.
        durable: fsync every commit (``sync`` and ``metasync``).
        preallocate_bytes: disk bytes to allocate for the data file up front.

    Raises:
        lmdb.Error: one of :data:`DAMAGE`: the files are damaged.
        InvalidArgumentError: the environment cannot be opened or read (field ``path``).
    """
    writemap = preallocate_bytes >= map_size_bytes
    env = _open(path, map_size_bytes, durable, writemap)
    try:
        max_key = int(env.max_key_size())
        dbs = LmdbDatabases(env.open_db(VALUES_DB), env.open_db(ORDER_DB), env.open_db(META_DB))
        found = scan(env, dbs, path)
        reserved = _preallocate(path, preallocate_bytes)
    except DAMAGE:
        env.close()
        raise
    except lmdb.Error as exc:
        env.close()
        raise InvalidArgumentError("path", f"cannot load the LMDB environment at {path!r}: {exc}") from exc
    except BaseException:
        env.close()
        raise
    room = None if isinstance(reserved, bool) else reserved
    if writemap and reserved is not True:
        env.close()  # the map is not backed by disk blocks: no shared writable map
        writemap = False
        env = _open(path, map_size_bytes, durable, writemap)
        dbs = LmdbDatabases(env.open_db(VALUES_DB), env.open_db(ORDER_DB), env.open_db(META_DB))
    logger.info(
        "L3 at %s: map %d bytes, %s", path, map_size_bytes, "writemap" if writemap else "pwrite (no writemap)"
    )
    return OpenedEnvironment(env, dbs, max_key, found, writemap, room)


def open_or_recover(
    path: str, *, map_size_bytes: int, durable: bool, preallocate_bytes: int, recover_damaged: bool
) -> OpenedEnvironment:
    """:func:`open_environment`; on damage, move the environment aside and start empty if allowed.

    Raises:
        InvalidArgumentError: as :func:`open_environment`, and (field ``path``) damaged files when
            ``recover_damaged`` is False.
    """
    try:
        return open_environment(
            path, map_size_bytes=map_size_bytes, durable=durable, preallocate_bytes=preallocate_bytes
        )
    except DAMAGE as exc:
        if not recover_damaged:
            raise InvalidArgumentError("path", f"LMDB environment at {path!r} is damaged: {exc}") from exc
        aside = f"{path.rstrip(os.sep)}.damaged-{int(time.time())}"
        logger.error("L3 at %s is damaged (%s): moved aside to %s, starting empty", path, exc, aside)
        os.rename(path, aside)
    return open_environment(
        path, map_size_bytes=map_size_bytes, durable=durable, preallocate_bytes=preallocate_bytes
    )


def _room(fd: int) -> int:
    """The bytes the file ``fd`` can grow to: its allocated blocks plus the filesystem's free space."""
    fs = os.fstatvfs(fd)
    return os.fstat(fd).st_blocks * 512 + fs.f_bavail * fs.f_frsize


def _preallocate(path: str, want: int) -> bool | int:
    """Allocate ``want`` bytes of disk blocks for the data file unless it has them already.

    L3 never takes the last of the disk: when ``want`` is more than :data:`PREALLOCATE_SHARE` of the room
    (the data file's blocks plus the free space), nothing is allocated and the room is returned, so that
    the tier shrinks to it and the rest of the host keeps its share. Asking for more than the free space is
    no answer either: ext4 keeps what a failed ``fallocate`` allocated, which would leave the disk full for
    every other process on the host.

    Returns True when the blocks are allocated; when the filesystem is too small, the bytes the data file
    can grow to (its allocated blocks plus the free space); False when the filesystem cannot allocate
    (no ``fallocate``).
    """
    data = os.path.join(path, "data.mdb")
    fd = os.open(data, os.O_RDWR)
    try:
        if os.fstat(fd).st_blocks * 512 >= want:
            return True
        room = _room(fd)
        if want > room * PREALLOCATE_SHARE:
            logger.warning(
                "L3 at %s: the disk has room for %d bytes, too little to reserve %d bytes and leave the "
                "rest of the host its share; nothing preallocated",
                path,
                room,
                want,
            )
            return room
        os.posix_fallocate(fd, 0, want)
        return True
    except OSError as exc:
        if exc.errno == errno.ENOSPC:  # the free space shrank since it was read
            room = _room(fd)
            logger.warning("L3 at %s: the disk cannot hold %d bytes (%s); room %d", path, want, exc, room)
            return room
        logger.info("L3 at %s: no preallocation (%s); stores may run slower", path, exc)
        return False
    finally:
        os.close(fd)
