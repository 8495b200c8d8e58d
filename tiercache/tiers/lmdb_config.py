"""The configuration of an L3 (LMDB) tier, checked when it is made, and the space a chunk takes in it.

Every field is validated in ``__post_init__`` (an :class:`~tiercache.errors.InvalidArgumentError` names
the field), so that a tier is never opened with a config it cannot honour. The config also sizes what
follows from it: the LMDB map size, and a chunk's charge against the capacity (header + payload), which
the tier and the cache use to refuse a chunk that can never fit before reserving anything.

Durability: with ``durable=False`` the environment is opened with ``sync=False`` (no fsync per commit).
A process crash loses nothing: committed data is in the OS page cache. An OS crash or power loss may lose
the last commits; LMDB's documentation warns that without sync it can even damage the database. A torn or
damaged value is never served: the checksums turn it into a miss. With ``durable=True`` every commit is
fsynced before it returns.

Users import :class:`LmdbTierConfig` from :mod:`tiercache.tiers.lmdb`, next to the tier.

Primitives:
    LmdbTierConfig: path, capacity, codec, zstd level, durability, map size, damage recovery and read-fault
        injection of one L3 tier (its fields declare the daemon's ``l3_*`` options); ``read_faults``,
        ``effective_map_size_bytes``, ``preallocate_bytes``, ``fitted_capacity`` (the capacity within the map
        and the disk), ``charge``.
    default_l3_path, default_l3_bytes, free_bytes_at: the daemon's defaults, from this host's directories
        and free disk space.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tiercache.codec import Codec
from tiercache.errors import InvalidArgumentError
from tiercache.options import Computed, internal, option
from tiercache.parsers import parse_bool, parse_choice, parse_float, parse_int, parse_size, parse_str
from tiercache.tiers.faults import ReadFaults
from tiercache.tiers.values import HEADER_BYTES, MAX_ZSTD_LEVEL, MIN_ZSTD_LEVEL

logger = logging.getLogger(__name__)

_MAX_VALUE_BYTES = 0xFFFFFFFF
"""LMDB's largest value (``MDB_MAXDATASIZE``)."""
_MIN_EXTRA_MAP_BYTES = 1 << 30
_MIN_FITTED_BYTES = 1 << 20
"""Smallest L3 a disk that is too small for the configured capacity may shrink it to."""


L3_DEFAULT_CAP_BYTES = 8 << 30
"""The daemon's computed L3 capacity never exceeds this."""


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def default_l3_path(env: Mapping[str, str]) -> str:
    """``$XDG_CACHE_HOME/tiercache/l3``, else ``~/.cache/tiercache/l3``."""
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return str(Path(base) / "tiercache" / "l3")


def free_bytes_at(path: str) -> int:
    """Bytes available to this user on the filesystem that holds (or will hold) ``path``."""
    probe = Path(path).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    st = os.statvfs(probe)
    return int(st.f_bavail) * int(st.f_frsize)


def default_l3_bytes(path: str) -> int:
    """``min(8G, 10% of the free space on the filesystem of path)``; 0 when L3 is off."""
    if not path:
        return 0
    return min(L3_DEFAULT_CAP_BYTES, free_bytes_at(path) // 10)


@dataclass(frozen=True, slots=True)
class LmdbTierConfig:
    """Configuration of one L3 tier.

    Attributes:
        path: directory of the LMDB environment (created if missing).
        capacity_bytes: bound on the stored bytes (headers + payloads) plus outstanding reservations.
        codec: how payloads are stored; a zstd payload that is not smaller than the raw bytes is stored raw.
        zstd_level: zstd compression level, ``MIN_ZSTD_LEVEL..MAX_ZSTD_LEVEL`` (used with ``Codec.ZSTD``).
        durable: fsync every commit (``sync=True``); otherwise an OS crash may lose the last commits (see the
            module docstring).
        map_size_bytes: LMDB map size; None for ``max(4 * capacity_bytes, capacity_bytes + 1 GiB)``.
        recover_damaged: when the environment's files are damaged, move them aside
            (``<path>.damaged-<time>``) and start empty instead of failing: it is a cache.
        fault_read_delay_s: fault injection, off by default: extra latency added to every read call.
        fault_read_bytes_per_s: fault injection, off (0) by default: reads are throttled to this rate.
    """

    path: str = option(
        "l3_path",
        parse=parse_str,
        help='directory of the L3 LMDB environment ("" disables L3)',
        metavar="PATH",
        computed=Computed(
            lambda values: default_l3_path(values.env),
            "$XDG_CACHE_HOME/tiercache/l3 (~/.cache/tiercache/l3)",
            on_host=True,
            example="/var/cache/tiercache/l3",
        ),
    )
    capacity_bytes: int = option(
        "l3_bytes",
        parse=parse_size,
        help="L3 capacity",
        metavar="SIZE",
        computed=Computed(
            lambda values: default_l3_bytes(values.get_str("l3_path")),
            "min(8G, 10% of the free space on the --l3-path filesystem at start)",
            on_host=True,
            example=L3_DEFAULT_CAP_BYTES,
        ),
    )
    codec: Codec = option(
        "l3_codec",
        parse=parse_choice(Codec),
        help="L3 payload codec: raw or zstd",
        metavar="CODEC",
        default=Codec.RAW,
    )
    zstd_level: int = option(
        "l3_zstd_level",
        parse=parse_int,
        help="zstd level of L3 payloads (with --l3-codec zstd)",
        metavar="INT",
        default=3,
    )
    durable: bool = option(
        "l3_durable",
        parse=parse_bool,
        help="fsync every L3 commit (otherwise an OS crash may lose the last commits; checksums still catch "
        "torn values)",
        default=False,
    )
    map_size_bytes: int | None = internal(None)
    recover_damaged: bool = internal(True)
    fault_read_delay_s: float = option(
        "l3_fault_read_delay_s",
        parse=parse_float,
        help="fault injection, off by default: seconds added to every L3 read (for deadline tests)",
        metavar="FLOAT",
        default=0.0,
        note="off",
    )
    fault_read_bytes_per_s: int = option(
        "l3_fault_read_bytes_per_s",
        parse=parse_size,
        help="fault injection, off by default: throttle L3 reads to this many bytes per second",
        metavar="SIZE",
        default=0,
        note="off",
    )

    def __post_init__(self) -> None:
        ReadFaults(self.fault_read_delay_s, self.fault_read_bytes_per_s)  # validates them first
        if not isinstance(self.path, str) or not self.path:
            raise InvalidArgumentError("path", f"must be a non-empty string, got {self.path!r}")
        if not _is_int(self.capacity_bytes) or self.capacity_bytes <= 0:
            raise InvalidArgumentError(
                "capacity_bytes", f"must be a positive integer, got {self.capacity_bytes!r}"
            )
        if not isinstance(self.codec, Codec):
            valid = ", ".join(c.name for c in Codec)
            raise InvalidArgumentError("codec", f"must be a Codec ({valid}), got {self.codec!r}")
        if not _is_int(self.zstd_level) or not MIN_ZSTD_LEVEL <= self.zstd_level <= MAX_ZSTD_LEVEL:
            raise InvalidArgumentError(
                "zstd_level",
                f"must be an integer in [{MIN_ZSTD_LEVEL}, {MAX_ZSTD_LEVEL}], got {self.zstd_level!r}",
            )
        if not isinstance(self.durable, bool):
            raise InvalidArgumentError("durable", f"must be a bool, got {self.durable!r}")
        if self.map_size_bytes is not None and (not _is_int(self.map_size_bytes) or self.map_size_bytes <= 0):
            raise InvalidArgumentError(
                "map_size_bytes", f"must be a positive integer or None, got {self.map_size_bytes!r}"
            )

    @property
    def read_faults(self) -> ReadFaults:
        """The injected read faults (validated; none by default)."""
        return ReadFaults(self.fault_read_delay_s, self.fault_read_bytes_per_s)

    @property
    def effective_map_size_bytes(self) -> int:
        """The LMDB map size the tier opens with.

        Pages freed by a transaction are reusable only once no snapshot needs them, and a large value
        needs a contiguous run of pages, so the map is sized well above the capacity. It costs address
        space only: the data file is sparse (its apparent size is the map size, its disk use is what is
        written).
        """
        if self.map_size_bytes is not None:
            return self.map_size_bytes
        return max(4 * self.capacity_bytes, self.capacity_bytes + _MIN_EXTRA_MAP_BYTES)

    @property
    def preallocate_bytes(self) -> int:
        """Disk bytes allocated for the data file at open: the capacity and a quarter, within the map."""
        return min(self.effective_map_size_bytes, self.capacity_bytes + self.capacity_bytes // 4)

    def fitted_capacity(self, disk_room_bytes: int | None) -> int:
        """The capacity a tier runs with: the configured one, within the map and the disk's room.

        A capacity above the LMDB map size can never be reached (a full map stops commits before L3
        evicts): it is kept (a full map is a clean CapacityError) but logged. When the filesystem cannot hold
        the preallocation (``disk_room_bytes``: the bytes the data file can still grow to), the capacity is
        lowered to three quarters of that room (LMDB needs headroom for the pages a write frees only later),
        or refused when that is under 1 MiB. Each change is logged.

        Raises:
            InvalidArgumentError: (field ``capacity_bytes``) the disk has no room for a useful L3.
        """
        capacity, map_bytes = self.capacity_bytes, self.effective_map_size_bytes
        if capacity > map_bytes:
            logger.warning(
                "L3 at %s: capacity %d bytes exceeds the LMDB map of %d bytes: a full map will refuse "
                "commits before L3 evicts (raise map_size_bytes or lower the capacity)",
                self.path,
                capacity,
                map_bytes,
            )
        fit = capacity if disk_room_bytes is None else disk_room_bytes * 3 // 4
        if fit >= capacity:
            return capacity
        if fit < _MIN_FITTED_BYTES:
            raise InvalidArgumentError(
                "capacity_bytes",
                f"the filesystem of {self.path!r} has room for {disk_room_bytes} bytes, too little for an L3 "
                f"of {capacity} bytes (or the smallest of {_MIN_FITTED_BYTES}); free disk space, lower the "
                "L3 capacity (--l3-bytes) or move L3 (--l3-path)",
            )
        logger.warning(
            "L3 at %s: the filesystem has room for %d bytes, too little for the capacity of %d bytes; "
            "running with an L3 of %d bytes (lower --l3-bytes to silence this)",
            self.path,
            disk_room_bytes,
            capacity,
            fit,
        )
        return fit

    def charge(self, nbytes: int, field: str = "nbytes", capacity_bytes: int | None = None) -> int:
        """Capacity one chunk of ``nbytes`` payload bytes takes while reserved: header + ``nbytes``.

        ``capacity_bytes``: the capacity to check against (a tier's fitted one); None: the configured one.

        Raises:
            InvalidArgumentError: (named ``field``) ``nbytes`` is not a positive integer, or the chunk can
                never fit: over the capacity, or over LMDB's largest value.
        """
        if not _is_int(nbytes) or nbytes <= 0:
            raise InvalidArgumentError(field, f"must be a positive integer, got {nbytes!r}")
        total = HEADER_BYTES + nbytes
        capacity = self.capacity_bytes if capacity_bytes is None else capacity_bytes
        if total > capacity:
            raise InvalidArgumentError(
                field, f"{nbytes} bytes (+{HEADER_BYTES} header) exceed the capacity of {capacity} bytes"
            )
        if total > _MAX_VALUE_BYTES:
            raise InvalidArgumentError(field, f"{nbytes} bytes exceed LMDB's largest value")
        return total
