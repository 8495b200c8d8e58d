"""The shared tier's connection to Redis / Valkey: one seed URL, cluster or single server detected.

The store is reached with redis-py (``redis.cluster.RedisCluster`` for a cluster, ``redis.Redis`` for a
plain server); no protocol is written here. The first seed that answers decides what the store is: a node
whose ``INFO cluster`` says ``cluster_enabled:1`` is a cluster node, and the cluster client starts from
every seed given (it discovers the rest of the nodes and the slot map itself). Passwords and TLS come from
the URL as redis-py reads them (``rediss://``, ``?ssl_ca_certs=...``).

A chunk is a record of two plain string keys in one hash slot: its value header at
``<base>h`` and its payload at ``<base>p``, where the base ends in a hash tag (``{...}``, see
:func:`record_keys`) so that a cluster keeps both on one node. One ``MSET`` writes both (atomic: a reader
sees the old record or the new one) and one ``MGET`` reads both. Why not one string of header + payload:
redis-py sends a ``memoryview`` argument to the socket as it is, so the payload goes out straight from the
buffer it is in (an L2 slot, the caller's tensor), while header + payload in one string would need a copy
of every chunk behind its header first; and a plain string is what Redis keeps without copying a large
argument again (a hash field is copied: ``HSET`` measured 10-30 % slower than ``SET`` here, ``MSET`` of the
two keys within 5-10 %). A record with one part missing (the cluster's eviction took one key) reads as
absent.

hiredis, when installed, parses the replies (about twice as fast as redis-py's own parser for large values),
but commands are packed by redis-py's Python packer (:class:`_ViewsAsIs`): hiredis's packer copies a
``memoryview`` argument into ``bytes`` and then the whole command into one buffer, two copies of every
payload, where the Python packer sends a large argument to the socket as it is.

Every batch is one pipeline (no transaction: a cluster pipeline splits it by node), bounded by the socket
timeout. Failures are raised as two errors of this module only, so that the tier needs to know nothing of
redis-py: :class:`StoreUnavailable` (connection refused or lost, timeout, cluster down or reconfiguring)
and :class:`StoreRefused` (the store answered with an error, e.g. out of memory under ``noeviction``).

Connecting is lazy and retried: a store that is down when the daemon starts is connected to once it is up.

Primitives:
    StoreUnavailable, StoreRefused: what a call can fail with.
    record_keys: the header and payload keys of a record base.
    fast_connection_class: the redis-py connection class that sends large arguments without copies.
    SharedStore: read_many, write_many, exists_many, delete_many, kind, close.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

import redis
from redis._parsers import Encoder
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import Connection, PythonRespSerializer, SSLConnection
from redis.exceptions import RedisClusterException, RedisError, ResponseError
from redis.retry import Retry

from tiercache.errors import UnavailableError
from tiercache.tiers.shared_config import SharedTierConfig

logger = logging.getLogger(__name__)

T = TypeVar("T")

_HEADER_SUFFIX = b"h"
_PAYLOAD_SUFFIX = b"p"


def record_keys(base: bytes) -> tuple[bytes, bytes]:
    """The ``(header, payload)`` keys of the record whose base key is ``base`` (one hash slot: the base
    ends in a hash tag)."""
    return base + _HEADER_SUFFIX, base + _PAYLOAD_SUFFIX


class StoreUnavailable(UnavailableError):
    """The store could not be reached in time (down, too slow, cluster reconfiguring)."""


class StoreRefused(UnavailableError):
    """The store answered a command with an error (e.g. ``OOM command not allowed``)."""


_PACKER_CUTOFF = 6000
"""Arguments longer than this go to the socket as separate pieces, not copied (redis-py's default)."""


def _packer() -> PythonRespSerializer:
    return PythonRespSerializer(_PACKER_CUTOFF, Encoder("utf-8", "strict", False).encode)  # type: ignore[no-untyped-call]


class _ViewsAsIs(Connection):
    """A TCP connection whose commands are packed without copying large arguments (see the module
    docstring); replies are still parsed by hiredis when it is installed."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("command_packer", _packer())
        super().__init__(**kwargs)  # type: ignore[no-untyped-call]


class _TlsViewsAsIs(SSLConnection):
    """:class:`_ViewsAsIs` over TLS."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("command_packer", _packer())
        super().__init__(**kwargs)


def fast_connection_class(url: str) -> type[Connection] | None:
    """The connection class for ``url`` that packs without copying large arguments (None: redis-py's own,
    e.g. for a unix socket). Also what the bench's raw SET / GET ceiling uses, so that it is the best the
    client library does."""
    scheme = urlsplit(url).scheme
    return {"redis": _ViewsAsIs, "rediss": _TlsViewsAsIs}.get(scheme)


def _kwargs(config: SharedTierConfig) -> dict[str, Any]:
    """Client options: the tier's timeouts, and no retries inside redis-py (the breaker decides when to
    try again, so that one call never waits longer than its timeouts)."""
    return {
        "socket_timeout": config.op_timeout_s,
        "socket_connect_timeout": config.connect_timeout_s,
        "retry": Retry(NoBackoff(), 0),
    }


class SharedStore:
    """A thread-safe handle on the store (cluster or single server); connects on first use."""

    def __init__(self, config: SharedTierConfig) -> None:
        """Args: config: the tier's configuration (seed URLs, timeouts). Nothing is contacted yet."""
        self._config = config
        self._lock = threading.Lock()
        self._client: redis.Redis | RedisCluster | None = None
        self._closed = False

    @property
    def kind(self) -> str:
        """``"cluster"``, ``"server"``, or ``"unconnected"``."""
        with self._lock:
            client = self._client
        if client is None:
            return "unconnected"
        return "cluster" if isinstance(client, RedisCluster) else "server"

    def _connect(self) -> redis.Redis | RedisCluster:
        """The client, connecting (and detecting the store's kind) on first use."""
        with self._lock:
            if self._closed:
                raise StoreUnavailable("the shared store handle is closed")
            if self._client is not None:
                return self._client
            seeds = self._config.seeds
            errors: list[str] = []
            for seed in seeds:
                probe = redis.Redis.from_url(seed, **_kwargs(self._config))
                try:
                    cluster = int(probe.info("cluster").get("cluster_enabled", 0)) == 1
                except (RedisError, OSError) as exc:
                    errors.append(f"{_safe(seed)}: {exc}")
                    continue
                finally:
                    probe.close()
                self._client = self._open(seed, seeds, cluster)
                logger.info(
                    "shared tier connected to a %s through %s",
                    "cluster" if cluster else "server",
                    _safe(seed),
                )
                return self._client
            raise StoreUnavailable("no seed answered: " + "; ".join(errors))

    def _open(self, seed: str, seeds: Sequence[str], cluster: bool) -> redis.Redis | RedisCluster:
        kwargs = _kwargs(self._config)
        packing = fast_connection_class(seed)
        if packing is not None:
            # A TLS cluster's URL sets redis-py's own SSL class over this one: its commands are packed by
            # hiredis then (copies, correct).
            kwargs["connection_class"] = packing
        if not cluster:
            return redis.Redis.from_url(seed, **kwargs)
        nodes = []
        for url in seeds:
            parts = urlsplit(url)
            nodes.append(ClusterNode(parts.hostname or "localhost", parts.port or 6379))  # type: ignore[no-untyped-call]
        try:
            return RedisCluster.from_url(seed, startup_nodes=nodes, **kwargs)
        except (RedisError, RedisClusterException, OSError) as exc:
            raise StoreUnavailable(f"cluster through {_safe(seed)}: {exc}") from exc

    def _call(self, run: Callable[[redis.Redis | RedisCluster], T]) -> T:
        client = self._connect()
        try:
            return run(client)
        except ResponseError as exc:
            raise StoreRefused(str(exc)) from exc
        except (RedisError, RedisClusterException, OSError) as exc:
            raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc

    def _pipeline(self, add: Callable[[Any], None]) -> list[Any]:
        """Run the commands ``add`` queues as one pipeline; any error reply raises."""

        def run(client: redis.Redis | RedisCluster) -> list[Any]:
            pipe = client.pipeline(transaction=False)
            add(pipe)
            replies = pipe.execute(raise_on_error=False)
            for reply in replies:
                if isinstance(reply, ResponseError):
                    raise reply
                if isinstance(reply, Exception):
                    raise StoreUnavailable(f"{type(reply).__name__}: {reply}")
            return list(replies)

        return self._call(run)

    def read_many(self, bases: Sequence[bytes]) -> list[tuple[bytes, bytes] | None]:
        """Per record base, its ``(header, payload)``, or None where a part is absent; one pipeline."""

        def add(pipe: Any) -> None:
            for base in bases:
                pipe.execute_command("MGET", *record_keys(base))

        out: list[tuple[bytes, bytes] | None] = []
        for head, payload in self._pipeline(add):
            out.append(None if head is None or payload is None else (head, payload))
        return out

    def write_many(self, items: Sequence[tuple[bytes, bytes, bytes | bytearray | memoryview]]) -> None:
        """Write ``(base, header, payload)`` records in one pipeline, one ``MSET`` of both keys each
        (atomic: a reader sees the old record or the new one); the payload is sent without a copy."""

        def add(pipe: Any) -> None:
            for base, head, payload in items:
                head_key, payload_key = record_keys(base)
                pipe.execute_command("MSET", head_key, head, payload_key, payload)

        self._pipeline(add)

    def exists_many(self, bases: Sequence[bytes]) -> list[bool]:
        """Per record base, whether both of its keys are present, in one pipeline."""

        def add(pipe: Any) -> None:
            for base in bases:
                pipe.execute_command("EXISTS", *record_keys(base))

        return [int(v) == 2 for v in self._pipeline(add)]

    def delete_many(self, bases: Sequence[bytes]) -> int:
        """Delete records (both keys; one ``DEL`` each: a cluster's records live on many nodes); returns
        how many had a key."""

        def add(pipe: Any) -> None:
            for base in bases:
                pipe.execute_command("DEL", *record_keys(base))

        return sum(1 for v in self._pipeline(add) if int(v) > 0)

    def close(self) -> None:
        """Close the connections (idempotent); later calls fail with StoreUnavailable."""
        with self._lock:
            client, self._client, self._closed = self._client, None, True
        if client is not None:
            client.close()


def _safe(url: str) -> str:
    """A URL without its password, for log lines."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    return f"{parts.scheme}://{host}:{parts.port or 6379}"
