"""Single-flight prefill from the engine's side: requests that miss the same prefix compute it once.

:meth:`KVConnector.prefill_claim` asks the daemon which of a prompt's uncached chunks other requests are
computing already (wait for those) and which this request now leads (compute them and publish each as soon as
it is done, so that waiting requests can go on). Requests whose prompts share only part of a prefix wait only
for the shared part. A typical engine step::

    with connector.prefill_claim(tokens) as claim:
        if claim.wait_tokens:
            claim.wait(timeout_s=2.0)        # returns when the others' chunks are published, their leader is
                                             # gone (then this request takes them over), or at the timeout
        loaded = connector.load(tokens, kv)  # whatever is cached now
        for done in prefill_steps(start=loaded.tokens_loaded):   # the engine's chunked prefill
            claim.publish(kv, done)          # store + commit the led chunks computed so far
    # leaving the block releases what was not published: other requests may take it over at once

Every call is best effort: daemon trouble is logged, waits return what is cached, publications are dropped
(and the claim released so that nobody waits for it), and the engine simply computes everything itself.

Primitives:
    PrefillClaim: wait, publish, release; cached / wait / lead / takeover / published tokens; a context
        manager.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from types import TracebackType

import torch

from tiercache.errors import TierCacheError
from tiercache.keys import Namespace
from tiercache.layout import KVLayout

from .client import TierCacheClient
from .dataplane import SlotMapping
from .kv import EngineKV, check_kv, kv_to_chunk
from .results import PrefillClaimInfo, SlotRef, StoreTicket

logger = logging.getLogger(__name__)


class PrefillClaim:
    """One request's share of a single-flight prefill (positions below count chunks of the prompt).

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
        mapping: Callable[[], SlotMapping | None],
        ttl_s: float = 0.0,
        store_ttl_s: float = 0.0,
    ) -> None:
        """Wrap the daemon's answer to ClaimPrefill (internal: made by the connector).

        Args:
            client: the daemon client.
            namespace: the namespace.
            keys: the prompt's chunk keys.
            info: the daemon's answer; None when it could not be asked.
            mapping: the daemon's shared-memory segment, None for the byte stream.
            ttl_s: claim lifetime for take-overs (0: the daemon's default).
            store_ttl_s: lifetime of the publication's store ticket (0: the daemon's default).
        """
        self.keys = keys
        self.coordinated = info is not None
        self._client = client
        self._namespace = namespace
        self._layout: KVLayout = namespace.layout
        self._mapping = mapping
        self._ttl_s = ttl_s
        self._store_ttl_s = store_ttl_s
        self._cached = info.cached if info is not None else 0
        self._wait_end = info.cached + info.wait if info is not None else 0
        self._takeovers = info.takeovers if info is not None else 0
        self._claim_ids = [info.claim_id] if info is not None and info.claim_id else []
        self._ticket: StoreTicket | None = None
        self._slots: dict[int, SlotRef] = {}
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
        if n < self._wait_end and self._ticket is None:
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
            mapping = self._mapping()
            if mapping is None:
                self._publish_stream(kv, todo)
            else:
                self._publish_shm(kv, todo, mapping, start)
        except TierCacheError as exc:
            logger.warning("tiercache prefill publication failed (%s); releasing the claim", exc)
            self._broken = True
            self.release()
        return self.published_tokens

    def release(self) -> None:
        """Give up what is not published yet: waiting requests may take it over at once (idempotent)."""
        ticket, self._ticket = self._ticket, None
        if ticket is not None and any(p not in self._published for p in self._slots):
            try:
                self._client.abort_store(self._namespace, ticket.ticket_id)
            except TierCacheError as exc:
                logger.warning("aborting prefill store ticket failed (%s); it expires at its TTL", exc)
        claims, self._claim_ids = self._claim_ids, []
        for claim_id in claims:
            try:
                self._client.release_prefill(self._namespace, claim_id)
            except TierCacheError as exc:
                logger.warning("releasing prefill claim %d failed (%s); it lapses at its TTL", claim_id, exc)

    close = release

    def __enter__(self) -> PrefillClaim:
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

    def _publish_shm(self, kv: EngineKV, todo: list[int], mapping: SlotMapping, start: int) -> None:
        if self._ticket is None:
            self._ticket = self._client.begin_store(
                self._namespace, self.keys[start:], start_depth=start, ttl_s=self._store_ttl_s
            )
            self._slots = {start + ref.index: ref for ref in self._ticket.slots}
        refs = [self._slots[p] for p in todo if p in self._slots]
        if refs:
            with mapping.use() as slots:
                for p in todo:
                    if p in self._slots:
                        kv_to_chunk(self._layout, kv, p, slots.view(self._slots[p]))
            self._client.commit_store(
                self._namespace, self._ticket.ticket_id, indices=[ref.index for ref in refs]
            )
        self._ours += len(refs)
        self._published.update(todo)  # positions without a slot were cached or stored by someone else

    def _publish_stream(self, kv: EngineKV, todo: list[int]) -> None:
        staging = torch.empty(self._layout.chunk_bytes, dtype=torch.uint8)

        def payloads() -> Iterator[torch.Tensor]:
            for p in todo:
                kv_to_chunk(self._layout, kv, p, staging)
                yield staging

        result = self._client.stream_store(
            self._namespace, [self.keys[p] for p in todo], payloads(), start_depth=todo[0]
        )
        self._ours += result.stored
        self._published.update(todo)
