"""Single-flight prefill from the engine's side: requests that miss the same prefix compute it once.

:meth:`KVConnector.prefill_claim` asks the daemon which of a prompt's uncached chunks other requests are
computing already (wait for those) and which this request now leads (compute them and publish each as soon as
it is done, so that waiting requests can go on). Requests whose prompts share only part of a prefix wait only
for the shared part. A typical engine step::

    with connector.prefill_claim(tokens) as claim:      # a PrefillLease
        if claim.wait_tokens:
            claim.wait(timeout_s=2.0)        # returns when the others' chunks are published, their leader is
                                             # gone (then this request takes them over), or at the timeout
        loaded = connector.load(tokens, kv)  # whatever is cached now
        for done in prefill_steps(start=loaded.tokens_loaded):   # the engine's chunked prefill
            claim.publish(kv, done)          # store + commit the led chunks computed so far
    # leaving the block releases what was not published: other requests may take it over at once

Every call is best effort: daemon trouble is logged, waits return what is cached, publications are dropped
(and the claim released so that nobody waits for it), and the engine simply computes everything itself.
Publications go through the connector's data plane (:class:`~.dataplane.PrefillPublisher`).

Primitives:
    PrefillLease: wait, publish, release; cached / wait / lead / takeover / published tokens; a context
        manager.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import TracebackType

from tiercache.errors import TierCacheError
from tiercache.keys import Namespace
from tiercache.layout import KVLayout

from .client import TierCacheClient
from .dataplane import DataPlane, PrefillPublisher
from .kv import EngineKV
from .kv_check import check_kv
from .results import PrefillClaimInfo

logger = logging.getLogger(__name__)


class PrefillLease:
    """One request's share of a single-flight prefill (positions below count chunks of the prompt): the
    chunks it waits for, and its lease on the chunks it leads (from :meth:`KVConnector.prefill_claim`).

    Attributes:
        keys: the prompt's chunk keys.
        coordinated: False when the daemon could not be asked: the request computes everything itself.
    """

    def __init__(
        self,
        client: TierCacheClient,
        namespace: Namespace,
        keys: list[bytes],
        info: PrefillClaimInfo | None,
        data_plane: Callable[[], DataPlane],
        ttl_s: float = 0.0,
    ) -> None:
        """Wrap the daemon's answer to ClaimPrefill (internal: made by the connector).

        Args:
            client: the daemon client.
            namespace: the namespace.
            keys: the prompt's chunk keys.
            info: the daemon's answer; None when it could not be asked.
            data_plane: the connector's data plane (asked at the first publication; raises TierCacheError
                on daemon trouble).
            ttl_s: claim lifetime for take-overs (0: the daemon's default).
        """
        self.keys = keys
        self.coordinated = info is not None
        self._client = client
        self._namespace = namespace
        self._layout: KVLayout = namespace.layout
        self._data_plane = data_plane
        self._ttl_s = ttl_s
        self._cached = info.cached if info is not None else 0
        self._wait_end = info.cached + info.wait if info is not None else 0
        self._takeovers = info.takeovers if info is not None else 0
        self._claim_ids = [info.claim_id] if info is not None and info.claim_id else []
        self._publisher: PrefillPublisher | None = None
        self._published: set[int] = set()
        self._ours = 0
        self._broken = False

    # ------------------------------------------------------------------ what this request has to do

    @property
    def chunk_tokens(self) -> int:
        """Tokens per chunk."""
        return self._layout.chunk_tokens

    @property
    def cached_tokens(self) -> int:
        """Tokens of the prefix known to be cached (at the claim, or when the last wait ended)."""
        return self._cached * self.chunk_tokens

    @property
    def wait_tokens(self) -> int:
        """Tokens after the cached prefix that other requests compute (0: nothing to wait for)."""
        return max(0, self._wait_end - self._cached) * self.chunk_tokens

    @property
    def lead_start_tokens(self) -> int:
        """Where the part this request computes and publishes begins."""
        return max(self._wait_end, self._cached) * self.chunk_tokens

    @property
    def lead_tokens(self) -> int:
        """Tokens of the full chunks this request leads: compute and publish them."""
        return max(0, len(self.keys) - max(self._wait_end, self._cached)) * self.chunk_tokens

    @property
    def takeover_tokens(self) -> int:
        """Of the led tokens, those an earlier leader gave up or lost at its TTL."""
        return self._takeovers * self.chunk_tokens

    @property
    def leader(self) -> bool:
        """Whether this request computes chunks others may wait for."""
        return bool(self._claim_ids)

    @property
    def published_tokens(self) -> int:
        """Tokens of the chunks this request published so far."""
        return self._ours * self.chunk_tokens

    # ------------------------------------------------------------------ calls

    def wait(self, timeout_s: float) -> int:
        """Wait for the chunks other requests compute: until they are published, their leader is gone, or
        ``timeout_s``. Chunks whose leader is gone are taken over: this request now leads them.

        Returns:
            Tokens of the prefix cached when the wait ended (load them, compute the rest).
        """
        if self._wait_end <= self._cached or not self.coordinated:
            return self.cached_tokens
        shared = self.keys[: self._wait_end]
        try:
            n = self._client.wait_prefill(self._namespace, shared, timeout_s)
        except TierCacheError as exc:
            logger.warning("tiercache prefill wait failed (%s); computing the rest", exc)
            return self.cached_tokens
        self._cached = max(self._cached, n)
        if n < self._wait_end and (self._publisher is None or not self._publisher.reserved):
            self._take_over(shared)
        return self.cached_tokens

    def publish(self, kv: EngineKV, computed_tokens: int) -> int:
        """Store and publish the led chunks that lie fully inside the first ``computed_tokens`` tokens.

        Call it after each prefill step; waiting requests go on as soon as their chunks are published.

        Args:
            kv: the engine's tensors holding the prompt's KV so far.
            computed_tokens: tokens of the prompt whose KV is computed (in every layer).

        Returns:
            Tokens this request published so far.

        Raises:
            InvalidArgumentError: ``kv`` does not match the layout.
        """
        c = self.chunk_tokens
        start = max(self._wait_end, self._cached)
        upto = min(len(self.keys), computed_tokens // c)
        todo = [p for p in range(start, upto) if p not in self._published]
        if self._broken or not todo:
            return self.published_tokens
        check_kv(self._layout, kv, upto)
        try:
            if self._publisher is None:
                self._publisher = self._data_plane().prefill_publisher(self.keys, start)
            self._ours += self._publisher.publish(kv, todo)
            self._published.update(todo)
        except TierCacheError as exc:
            logger.warning("tiercache prefill publication failed (%s); releasing the claim", exc)
            self._broken = True
            self.release()
        return self.published_tokens

    def release(self) -> None:
        """Give up what is not published yet: waiting requests may take it over at once (idempotent)."""
        publisher, self._publisher = self._publisher, None
        if publisher is not None:
            publisher.abort()
        claims, self._claim_ids = self._claim_ids, []
        for claim_id in claims:
            try:
                self._client.release_prefill(self._namespace, claim_id)
            except TierCacheError as exc:
                logger.warning("releasing prefill claim %d failed (%s); it lapses at its TTL", claim_id, exc)

    close = release

    def __enter__(self) -> PrefillLease:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    # ------------------------------------------------------------------ internals

    def _take_over(self, shared: list[bytes]) -> None:
        """Claim the chunks before this request's own part whose leader is gone."""
        try:
            info = self._client.claim_prefill(self._namespace, shared, self._ttl_s)
        except TierCacheError as exc:
            logger.warning("tiercache prefill take-over failed (%s)", exc)
            return
        if info.claim_id:
            self._claim_ids.append(info.claim_id)
            self._takeovers += info.takeovers
        self._cached = max(self._cached, info.cached)
        self._wait_end = info.cached + info.wait
