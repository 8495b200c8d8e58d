"""The configuration of the shared (Redis / Valkey cluster) tier, checked when it is made.

Every field is validated in ``__post_init__`` (an :class:`~tiercache.errors.InvalidArgumentError` names the
field), so that a tier is never built with a config it cannot honour. The seed URL says where the store is;
whether it is a Redis Cluster or one plain server is detected when the tier first connects
(:mod:`tiercache.tiers.shared_client`).

Capacity and eviction belong to the cluster (run it with ``maxmemory`` and ``maxmemory-policy
allkeys-lru``): by default the tier puts no bound of its own on what it writes (``capacity_bytes = 0``). A
positive ``capacity_bytes`` bounds the bytes this daemon tracks as written there; the cache manager then
evicts (deletes) its own least recently used chunks from the store to stay under it.

Primitives:
    SharedTierConfig: seed URL(s), capacity, codec, zstd level, key prefix, timeouts and backoff of one
        shared tier (its fields declare the daemon's ``shared_*`` options); ``seeds``, ``bounded``, ``charge``.
    UNBOUNDED_BYTES: the capacity an unbounded shared tier reports.
    parse_seeds: the seed URLs of a comma-separated list, checked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from urllib.parse import urlsplit

from tiercache.codec import Codec
from tiercache.errors import InvalidArgumentError
from tiercache.options import Option, internal, option
from tiercache.parsers import parse_choice, parse_float, parse_str
from tiercache.tiers.values import HEADER_BYTES, MAX_ZSTD_LEVEL, MIN_ZSTD_LEVEL

UNBOUNDED_BYTES = 1 << 62
"""Capacity reported by a shared tier without a bound of its own: the cluster's ``maxmemory`` governs."""

_MAX_VALUE_BYTES = 512 << 20
"""Redis' largest string value (``proto-max-bulk-len`` default)."""

_SCHEMES = ("redis", "rediss")

_TIMEOUT = Option(
    "shared_timeout_s",
    parse_float,
    "socket timeout of one shared-tier call (and of a connection attempt), seconds: a slower or dead store "
    "is turned off with backoff",
    "FLOAT",
    default=0.5,
)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_seeds(url: str, field: str = "url") -> tuple[str, ...]:
    """The seed URLs of ``url`` (one ``redis://`` / ``rediss://`` URL, or several separated by commas).

    Raises:
        InvalidArgumentError: (named ``field``) empty, a scheme other than redis/rediss, or no host.
    """
    if not isinstance(url, str) or not url.strip():
        raise InvalidArgumentError(field, f"must be a redis:// or rediss:// URL, got {url!r}")
    seeds = tuple(part.strip() for part in url.split(",") if part.strip())
    for seed in seeds:
        try:
            parts = urlsplit(seed)
            port = parts.port
        except ValueError as exc:
            raise InvalidArgumentError(field, f"{seed!r} is not a URL: {exc}") from None
        if parts.scheme not in _SCHEMES:
            raise InvalidArgumentError(field, f"{seed!r}: the scheme must be redis:// or rediss://")
        if not parts.hostname:
            raise InvalidArgumentError(field, f"{seed!r} names no host")
        del port
    if not seeds:
        raise InvalidArgumentError(field, f"must be a redis:// or rediss:// URL, got {url!r}")
    return seeds


@dataclass(frozen=True, slots=True)
class SharedTierConfig:
    """Configuration of one shared tier.

    Attributes:
        url: a ``redis://`` or ``rediss://`` (TLS) URL of one seed node, or several separated by commas;
            a password goes in the URL (``redis://:secret@host:6379``), TLS options as redis-py reads
            them from it (``?ssl_cert_reqs=required&ssl_ca_certs=/path``).
        capacity_bytes: 0: no bound of the tier's own (the cluster evicts); else a bound on the stored bytes
            this daemon tracks in the store plus outstanding reservations.
        codec: how payloads are sent and stored; a zstd payload that is not smaller is stored raw.
        zstd_level: zstd level (used with ``Codec.ZSTD``).
        key_prefix: prefix of every key this tier writes (followed by ``{`` + the chunk id in hex + ``}``:
            the tenant-scoped namespace id and the chunk key, as a hash tag); no braces of its own.
        op_timeout_s: socket timeout of one command or pipeline: no call waits longer on a slow store.
        connect_timeout_s: timeout of one connection attempt.
        backoff_initial_s: after a failure the tier is off for this long, then tried again.
        backoff_max_s: the longest time off; each failure in a row doubles it up to this.
    """

    url: str = option(
        "shared_url",
        parse=parse_str,
        help="the shared tier: a redis:// or rediss:// URL of one Redis Cluster / Valkey node or plain server "
        "(comma-separated seeds also work; cluster or server is detected; a password goes in the URL, "
        "redis://:secret@host:6379; TLS with rediss://). Every daemon of a fleet on the same URL shares "
        "chunks; run the cluster with maxmemory set and maxmemory-policy allkeys-lru: its capacity is the "
        "cluster's",
        metavar="URL",
        default="",
        note="off",
        required=True,
    )
    capacity_bytes: int = internal(0)
    codec: Codec = option(
        "shared_codec",
        parse=parse_choice(Codec),
        help="shared-tier payload codec: raw or zstd",
        metavar="CODEC",
        default=Codec.RAW,
    )
    zstd_level: int = internal(1)
    key_prefix: str = internal("tc:")
    op_timeout_s: float = _TIMEOUT.field()
    connect_timeout_s: float = _TIMEOUT.field()
    backoff_initial_s: float = internal(0.5)
    backoff_max_s: float = internal(30.0)

    def __post_init__(self) -> None:
        parse_seeds(self.url)
        if not _is_int(self.capacity_bytes) or self.capacity_bytes < 0:
            raise InvalidArgumentError(
                "capacity_bytes", f"must be a non-negative integer, got {self.capacity_bytes!r}"
            )
        if not isinstance(self.codec, Codec):
            valid = ", ".join(c.name for c in Codec)
            raise InvalidArgumentError("codec", f"must be a Codec ({valid}), got {self.codec!r}")
        if not _is_int(self.zstd_level) or not MIN_ZSTD_LEVEL <= self.zstd_level <= MAX_ZSTD_LEVEL:
            raise InvalidArgumentError(
                "zstd_level",
                f"must be an integer in [{MIN_ZSTD_LEVEL}, {MAX_ZSTD_LEVEL}], got {self.zstd_level!r}",
            )
        if not isinstance(self.key_prefix, str):
            raise InvalidArgumentError("key_prefix", f"must be a string, got {self.key_prefix!r}")
        if "{" in self.key_prefix or "}" in self.key_prefix:
            # A brace would start the hash tag in the prefix: every chunk on one cluster node.
            raise InvalidArgumentError(
                "key_prefix", f"must not contain '{{' or '}}', got {self.key_prefix!r}"
            )
        for name in ("op_timeout_s", "connect_timeout_s", "backoff_initial_s", "backoff_max_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise InvalidArgumentError(name, f"must be a finite number of seconds, got {value!r}")
            if value <= 0:
                raise InvalidArgumentError(name, f"must be > 0, got {value!r}")
        if self.backoff_max_s < self.backoff_initial_s:
            raise InvalidArgumentError(
                "backoff_max_s", f"must be >= backoff_initial_s ({self.backoff_initial_s!r})"
            )

    @property
    def seeds(self) -> tuple[str, ...]:
        """The seed URLs."""
        return parse_seeds(self.url)

    @property
    def bounded(self) -> bool:
        """Whether the tier bounds what it writes itself (``capacity_bytes > 0``)."""
        return self.capacity_bytes > 0

    @property
    def effective_capacity_bytes(self) -> int:
        """The capacity the tier reports: ``capacity_bytes``, or :data:`UNBOUNDED_BYTES` when 0."""
        return self.capacity_bytes or UNBOUNDED_BYTES

    def charge(self, nbytes: int, field: str = "nbytes") -> int:
        """Capacity one chunk of ``nbytes`` payload bytes takes while reserved: header + ``nbytes``.

        Raises:
            InvalidArgumentError: (named ``field``) ``nbytes`` is not a positive integer, or the chunk can
                never fit: over the capacity, or over Redis' largest value.
        """
        if not _is_int(nbytes) or nbytes <= 0:
            raise InvalidArgumentError(field, f"must be a positive integer, got {nbytes!r}")
        total = HEADER_BYTES + nbytes
        if total > self.effective_capacity_bytes:
            raise InvalidArgumentError(
                field,
                f"{nbytes} bytes (+{HEADER_BYTES} header) exceed the capacity of {self.capacity_bytes} bytes",
            )
        if total > _MAX_VALUE_BYTES:
            raise InvalidArgumentError(field, f"{nbytes} bytes exceed Redis' largest value (512 MiB)")
        return total
