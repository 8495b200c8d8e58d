"""Single-flight prefill over the index: the prefill coordinator's claims and waits, against what is cached.

:class:`~tiercache.prefill.PrefillCoordinator` decides who computes which chunks of a chain, given how much
of it is cached; this part tells it, reading the chain's contiguous cached prefix from the index under the
cache's index lock — never while holding the coordinator's own lock, which the coordinator never holds
while it calls back.

Primitives:
    PrefillClaims: claim, wait.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from tiercache.cache.index import Index
from tiercache.prefill import PrefillClaim, PrefillCoordinator


class PrefillClaims:
    """The coordinator's claims and waits, measured against the index."""

    def __init__(self, lock: threading.RLock, index: Index, coordinator: PrefillCoordinator) -> None:
        """Args: the cache's index lock and index, and the prefill coordinator."""
        self._lock = lock
        self._index = index
        self._coordinator = coordinator

    def claim(self, cids: Sequence[bytes], ttl: float) -> PrefillClaim:
        """See :meth:`CacheManager.claim_prefill` (arguments already checked)."""
        return self._coordinator.claim(cids, self._cached(cids), ttl)

    def wait(self, cids: Sequence[bytes], timeout: float, claim_id: int) -> int:
        """See :meth:`CacheManager.wait_prefill` (arguments already checked)."""
        return self._coordinator.wait(cids, lambda: self._cached(cids), timeout, claim_id)

    def _cached(self, cids: Sequence[bytes]) -> int:
        with self._lock:
            return len(self._index.cached_prefix(cids))
