"""The namespace registry: the namespaces a cache knows, and the chunk ids of their keys.

A namespace is registered per tenant (idempotently): its id is scoped by the tenant, so two tenants never
share a chunk id. Registration checks first that the namespace's chunks fit every tier, so that a layout
that can never be stored fails at once, naming ``layout``, rather than at its first store. The registry is
guarded by the cache's index lock (given to it), like every other part.

Primitives:
    Namespaces: register, get, chunk_ids / chain, len.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence

from tiercache.errors import InvalidArgumentError, NotFoundError
from tiercache.keychain import PackedKeys
from tiercache.keys import KEY_BYTES, Namespace, check_key, chunk_id
from tiercache.tiers.base import StorageTier, TierLevel

logger = logging.getLogger(__name__)


class Namespaces:
    """Registered namespaces by id."""

    def __init__(self, lock: threading.RLock, tiers: Mapping[TierLevel, StorageTier]) -> None:
        """Args: the cache's index lock and its tiers (registration checks a chunk fits each)."""
        self._lock = lock
        self._tiers = tiers
        self._by_id: dict[bytes, Namespace] = {}

    def __len__(self) -> int:
        """Namespaces registered."""
        with self._lock:
            return len(self._by_id)

    def register(self, namespace: Namespace, tenant: str, check_open: Callable[[], None]) -> bytes:
        """See :meth:`CacheManager.register_namespace`."""
        if not isinstance(namespace, Namespace):
            raise InvalidArgumentError("namespace", f"must be a Namespace, got {type(namespace).__name__}")
        nbytes = namespace.layout.chunk_bytes
        for level, tier in self._tiers.items():
            try:
                charge = tier.charge(nbytes)
            except InvalidArgumentError as exc:
                raise InvalidArgumentError(
                    "layout", f"chunks of {nbytes} bytes do not fit {level.name}: {exc}"
                ) from None
            if charge > tier.usage().capacity_bytes:
                raise InvalidArgumentError(
                    "layout", f"a chunk of {nbytes} bytes exceeds {level.name}'s capacity"
                )
        if not isinstance(tenant, str):
            raise InvalidArgumentError("tenant", f"must be a string, got {type(tenant).__name__}")
        ns_id = namespace.scoped_id(tenant)
        with self._lock:
            check_open()
            if ns_id not in self._by_id:
                self._by_id[ns_id] = namespace
                logger.info(
                    "registered namespace %s (%s@%s)", ns_id.hex(), namespace.model_id, namespace.revision
                )
        return ns_id

    def get(self, namespace_id: bytes) -> Namespace:
        """The registered namespace of an id.

        Raises:
            NotFoundError: not registered.
        """
        with self._lock:
            ns = self._by_id.get(namespace_id)
        if ns is None:
            raise NotFoundError("namespace_id", f"namespace {bytes(namespace_id).hex()} is not registered")
        return ns

    def chunk_ids(self, namespace_id: bytes, keys: Sequence[bytes]) -> list[bytes]:
        """The storage ids of a registered namespace's keys.

        Raises:
            NotFoundError: unknown namespace.
            InvalidArgumentError: ``keys`` is a single value, or a key is malformed (``keys[i]``).
        """
        return self.chain(namespace_id, keys)[1]

    def chain(self, namespace_id: bytes, keys: Sequence[bytes]) -> tuple[Namespace, list[bytes]]:
        """A registered namespace and the storage ids of its keys, the id resolved once (a lookup needs both).

        Raises:
            NotFoundError: unknown namespace.
            InvalidArgumentError: ``keys`` is a single value, or a key is malformed (``keys[i]``).
        """
        return self.get(namespace_id), _ids(bytes(namespace_id), keys)


def _ids(prefix: bytes, keys: Sequence[bytes]) -> list[bytes]:
    """``prefix`` + each key, every key checked."""
    if isinstance(keys, PackedKeys):  # checked when packed: the ids in one pass
        return keys.prefixed(prefix)
    if isinstance(keys, (bytes, bytearray, str)):
        raise InvalidArgumentError("keys", "must be a sequence of keys, not a single value")
    try:  # the usual case, in two C-speed passes: bytes-like keys of the right length
        cids = list(map(prefix.__add__, keys))
    except TypeError:
        pass  # not bytes-like: checked one by one below, naming the key
    else:
        if set(map(len, cids)) <= {len(prefix) + KEY_BYTES}:
            return cids
    return [chunk_id(prefix, check_key(k, f"keys[{i}]")) for i, k in enumerate(keys)]
