"""Single-flight prefill: concurrent requests that miss the same chunks compute them once.

A request whose prompt misses the cache asks for a claim on the chunks it misses. Chunks another request
is already computing are its to wait for; the rest it leads: it computes them and publishes (stores) each
one as soon as it is done. A follower's wait returns as soon as the chunks it needs are published, when
their leader gives them up (abort, or death: a claim lapses at its TTL, renewed by every publication), or
at the follower's deadline. Whatever is not cached then, the follower claims (taking over) or recomputes.

Chunks are identified by storage id (namespace id + key): because keys are hash chains, two requests that
share a chunk share every chunk before it, so requests whose prompts share only part of a prefix wait only
for the shared part.

The coordinator never calls the cache while holding its own lock; the cache tells it about publications.

Primitives:
    PrefillClaim: what one request was granted (how much is cached, to wait for, to lead).
    PrefillCoordinator: claim, published, release, wait, stats.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tiercache.errors import InvalidArgumentError
from tiercache.ids import fresh_id
from tiercache.stats import PrefillStats

logger = logging.getLogger(__name__)

_MAX_ORPHANS = 100_000
"""Given-up chunks remembered (only to count take-overs)."""


@dataclass(frozen=True, slots=True)
class PrefillClaim:
    """A request's share of a prefill.

    Attributes:
        claim_id: id of the claim on the chunks this request leads (0 when it leads none).
        cached: contiguous chunks already cached when the claim was made.
        wait: chunks after ``cached`` that other requests are computing: wait for them.
        lead: chunks after ``cached + wait`` that this request now leads: compute and store them (or
            release the claim).
        takeovers: chunks led now that an earlier leader gave up or lost at its TTL.
        expires_at: coordinator-clock time at which the claim lapses unless a publication renews it.
    """

    claim_id: int
    cached: int
    wait: int
    lead: int
    takeovers: int
    expires_at: float


@dataclass(slots=True)
class _Claim:
    chunks: set[bytes]
    expires_at: float
    ttl_s: float


class PrefillCoordinator:
    """Claims, publication and waiting for single-flight prefill. Thread-safe."""

    def __init__(self, clock: Callable[[], float]) -> None:
        """Args: clock: monotonic seconds (the cache manager's clock)."""
        self._clock = clock
        self._cond = threading.Condition(threading.Lock())
        self._owner: dict[bytes, int] = {}
        self._claims: dict[int, _Claim] = {}
        self._orphans: OrderedDict[bytes, None] = OrderedDict()
        self._generation = 0
        self._waits = 0
        self._takeovers = 0
        self._expired = 0

    def claim(self, chunk_ids: Sequence[bytes], cached: int, ttl_s: float) -> PrefillClaim:
        """Claim the uncached chunks of a chain that nobody computes yet.

        Args:
            chunk_ids: the request's chain, as storage ids.
            cached: length of its contiguous cached prefix (from a lookup just before).
            ttl_s: claim lifetime; each publication of a claimed chunk renews it.

        Raises:
            InvalidArgumentError: ``cached`` out of range or ``ttl_s`` not positive.
        """
        if not 0 <= cached <= len(chunk_ids):
            raise InvalidArgumentError("cached", f"{cached} not in [0, {len(chunk_ids)}]")
        if not ttl_s > 0:
            raise InvalidArgumentError("ttl_s", f"must be > 0, got {ttl_s!r}")
        with self._cond:
            now = self._clock()
            self._reap(now)
            i = cached
            while i < len(chunk_ids) and chunk_ids[i] in self._owner:
                i += 1
            lead = [cid for cid in chunk_ids[i:] if cid not in self._owner]
            if not lead:
                return PrefillClaim(0, cached, i - cached, 0, 0, now)
            claim_id = fresh_id(self._claims.__contains__)  # unguessable: tiercache.ids
            self._claims[claim_id] = _Claim(set(lead), now + ttl_s, ttl_s)
            takeovers = 0
            for cid in lead:
                self._owner[cid] = claim_id
                if self._orphans.pop(cid, False) is None:
                    takeovers += 1
            self._takeovers += takeovers
            return PrefillClaim(claim_id, cached, i - cached, len(chunk_ids) - i, takeovers, now + ttl_s)

    def published(self, chunk_ids: Sequence[bytes]) -> None:
        """Chunks became readable in the cache: their waiters may go on; their leader's claim is renewed."""
        with self._cond:
            now = self._clock()
            changed = False
            for cid in chunk_ids:
                self._orphans.pop(cid, None)
                claim_id = self._owner.pop(cid, None)
                if claim_id is None:
                    continue
                changed = True
                claim = self._claims[claim_id]
                claim.chunks.discard(cid)
                claim.expires_at = now + claim.ttl_s
                if not claim.chunks:
                    del self._claims[claim_id]
            if changed:
                self._bump()

    def release(self, claim_id: int) -> int:
        """Give up a claim (the leader aborted): waiters wake up and may take over. Returns chunks released."""
        with self._cond:
            claim = self._claims.pop(claim_id, None)
            if claim is None:
                return 0
            self._drop(claim)
            self._bump()
            return len(claim.chunks)

    def wait(
        self,
        chunk_ids: Sequence[bytes],
        cached_prefix: Callable[[], int],
        timeout_s: float,
        claim_id: int = 0,
    ) -> int:
        """Wait until the next chunk this chain needs is cached or no other request computes it any more.

        Args:
            chunk_ids: the request's chain.
            cached_prefix: returns the chain's contiguous cached prefix now (called without the
                coordinator's lock held).
            timeout_s: the request's own deadline, from now.
            claim_id: the waiter's own claim (chunks it leads itself are not waited for).

        Returns:
            The contiguous cached prefix when the wait ends.
        """
        deadline = self._clock() + max(0.0, timeout_s)
        counted = False
        while True:
            with self._cond:
                generation = self._generation
            n = cached_prefix()
            with self._cond:
                if self._generation != generation:
                    continue
                now = self._clock()
                self._reap(now)
                owner = self._owner.get(chunk_ids[n]) if n < len(chunk_ids) else None
                if owner is None or owner == claim_id or now >= deadline:
                    return n
                if not counted:
                    self._waits += 1
                    counted = True
                # Wake at a publication or release, at the leader's TTL (to take over) or at the deadline.
                until = min(deadline, self._claims[owner].expires_at)
                self._cond.wait(timeout=max(0.0, until - now))

    def stats(self) -> PrefillStats:
        """A snapshot of the counters."""
        with self._cond:
            self._reap(self._clock())
            return PrefillStats(
                len(self._claims), len(self._owner), self._waits, self._takeovers, self._expired
            )

    def _reap(self, now: float) -> None:
        expired = [cid for cid, claim in self._claims.items() if claim.expires_at <= now]
        for claim_id in expired:
            claim = self._claims.pop(claim_id)
            self._drop(claim)
            self._expired += 1
            logger.warning(
                "prefill claim %d on %d chunks lapsed: its leader is gone", claim_id, len(claim.chunks)
            )
        if expired:
            self._bump()

    def _drop(self, claim: _Claim) -> None:
        for cid in claim.chunks:
            self._owner.pop(cid, None)
            self._orphans[cid] = None
        while len(self._orphans) > _MAX_ORPHANS:
            self._orphans.popitem(last=False)

    def _bump(self) -> None:
        self._generation += 1
        self._cond.notify_all()
