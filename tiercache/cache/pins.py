"""Pins under a tenant's quota: a pin that would take the tenant over its ``pinned_bytes`` is refused.

A pinned chunk is never evicted, so pinned bytes are room taken for good; a tenant's quota bounds them (a
pinned namespace's chunks count, and so do stores into it: :meth:`Tenants.storing` checks those here too).

Primitives:
    Pins: pin (checked), check_pin, check_pinned.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from tiercache.cache.parts import Parts
from tiercache.cache.quotas import NO_QUOTA, QuotaExceededError

if TYPE_CHECKING:
    from tiercache.cache.tenants import Tenants


class Pins:
    """Pinning and unpinning, a pin checked against its tenant's pinned bytes."""

    def __init__(self, parts: Parts, tenants: Tenants) -> None:
        """Args: the cache's parts, and its tenants (who owns a namespace, and the quotas)."""
        self._lock = parts.lock
        self._index = parts.index
        self._tenants = tenants

    def pin(self, namespace_id: bytes, cids: Sequence[bytes] | None, pinned: bool) -> int:
        """Pin or unpin chunks (``cids`` None: the whole namespace), a pin first checked against the tenant's
        pinned bytes (:meth:`check_pin`); returns how many chunks changed."""
        if pinned:
            self.check_pin(namespace_id, cids)
        with self._lock:
            if cids is None:
                return self._index.pin_namespace(namespace_id, pinned)
            return self._index.pin(cids, pinned)

    def check_pin(self, namespace_id: bytes, cids: Iterable[bytes] | None) -> None:
        """Refuse a pin that would take the tenant over its pinned bytes (``cids`` None: the namespace)."""
        tenant = self._tenants.tenant_of(namespace_id)
        quota = self._tenants.quota(tenant) if tenant is not None else NO_QUOTA
        if tenant is None or not quota.pinned_bytes:
            return
        with self._lock:
            if cids is None:
                if namespace_id in self._index.pinned_namespaces:
                    return
                entries = [e for _, e in self._index.of_namespace(namespace_id)]
            else:
                entries = [e for e in (self._index.visible(c) for c in cids) if e is not None]
            extra = sum(e.nbytes for e in entries if not self._index.is_pinned(e))
            self.check_pinned(tenant, quota.pinned_bytes, extra)

    def check_pinned(self, tenant: str, cap: int, extra: int) -> None:
        """Refuse ``extra`` more pinned bytes beyond ``cap`` of the tenant (call under the lock).

        Raises:
            QuotaExceededError: naming ``pinned_bytes``.
        """
        namespaces = self._tenants.namespaces_of(tenant)
        pinned = sum(
            e.nbytes
            for e in self._index.entries.values()
            if e.namespace_id in namespaces and not e.purged and self._index.is_pinned(e)
        )
        if pinned + extra > cap:
            raise QuotaExceededError(
                tenant, "pinned_bytes", cap, f"{pinned} bytes pinned, {extra} more would be"
            )
