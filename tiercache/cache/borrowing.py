"""Borrowing: a promotion into a tier where its tenant has a byte quota counts against that quota.

A tenant's quota of a tier is also its guaranteed share (:mod:`tiercache.cache.quotas`): its chunks are not
evicted for others while it holds no more than the share. Stores are trimmed to the quota before they
reserve. Promotions (an AcquireLoad bringing chunks up from L3, a prefetch, an explicit promote) used not to
be: a tenant could promote into all the free space and lease it, so that the leased chunks, unevictable,
took the room of another tenant within its share, which was then refused (RESOURCE_EXHAUSTED) and lost its
own chunks making room for itself.

Now a promotion is admitted like a store: the tenant's own chunks of the target tier are trimmed first
(evicted, demoted when a slower tier keeps them) until they, the promotions of the tenant in flight and this
one fit its quota; when none of its own can go (all leased or pinned) the promotion is not made, and the
load it serves ends its leased prefix there (the rest is recomputed or read otherwise). A tenant can so lease
at most its quota of a tier, and the free space the others' shares need stays free for them. Tiers and
tenants without a byte quota promote as before.

Primitives:
    Promotions: ``admitting(cid, dst)``, the mover's admission (:attr:`Mover.admit`).
"""

from __future__ import annotations

import contextlib
import logging
from collections import defaultdict
from collections.abc import Iterator
from typing import TYPE_CHECKING

from tiercache.cache.parts import Parts
from tiercache.cache.quotas import QuotaExceededError
from tiercache.tiers.base import TierLevel

if TYPE_CHECKING:
    from tiercache.cache.tenants import Tenants

logger = logging.getLogger(__name__)


class Promotions:
    """Admits promotions into quota'd tiers, trimming the promoting tenant's own chunks first."""

    def __init__(self, parts: Parts, tenants: Tenants) -> None:
        """Args: the cache's parts, and its tenants (quotas and the trim)."""
        self._lock = parts.lock
        self._index = parts.index
        self._tenants = tenants
        self._inflight: dict[tuple[str, TierLevel], int] = defaultdict(int)

    @contextlib.contextmanager
    def admitting(self, cid: bytes, dst: TierLevel) -> Iterator[bool]:
        """A context for one move of ``cid`` into ``dst`` (no lock held): its value says whether to make it.

        A promotion of a chunk whose tenant has a byte quota of ``dst`` holds a place among the tenant's
        promotions in flight while it runs (they count as held: concurrent promotions cannot overrun the
        quota together); copies down, chunks already there and chunks of tenants without a quota pass.
        """
        if not self._tenants.limited:  # no quotas: no lock taken per move
            yield True
            return
        admitted: tuple[str, TierLevel] | None = None
        with self._lock:
            entry = self._index.get(cid)
            namespace_id = entry.namespace_id if entry is not None else b""
            tenant = self._tenants.tenant_of(namespace_id) if entry is not None else None
            cap = self._tenants.quota(tenant).tier_bytes(dst) if tenant is not None else 0
            promotion = entry is not None and bool(entry.levels) and dst < min(entry.levels)
            if cap and promotion and tenant is not None:
                admitted = (tenant, dst)
                self._inflight[admitted] += 1
        if admitted is None:
            yield True
            return
        key = admitted
        try:
            self._tenants.trim_tier(admitted[0], namespace_id, dst, cap, lambda _lv: self._inflight[key], 0.0)
        except QuotaExceededError as exc:
            logger.debug("promotion of %s into %s not made: %s", cid.hex(), dst.name, exc)
            self._release(admitted)
            yield False
            return
        try:
            yield True
        finally:
            self._release(admitted)

    def _release(self, key: tuple[str, TierLevel]) -> None:
        with self._lock:
            self._inflight[key] -= 1
            if not self._inflight[key]:
                del self._inflight[key]
