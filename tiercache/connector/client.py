"""The engine-side gRPC client of the tiercache daemon: one typed method per RPC.

Each method turns its arguments into the request message and the response into a frozen result
(:mod:`.results`); deadlines, typed errors, backoff, reconnects and re-registration after a daemon restart are
the :class:`~.connection.Connection`'s. Namespaces are registered on first use (or explicitly with
:meth:`TierCacheClient.register`); every call takes the :class:`~tiercache.keys.Namespace` and the connection
supplies its current handle. The engine's cost models (prefill model for cost-aware loads, deadline model for
timeout loads) are declared per namespace with :meth:`TierCacheClient.declare_models` and sent with every
(re-)registration.

Lease releases and usage reports that need no answer ride on the namespace's next AcquireLoad or BeginStore
(:meth:`defer_release`, :meth:`defer_usage`, :mod:`.settle`): one round trip per load phase.

The byte-stream RPCs take and give wire messages: framing and encoding are the byte-stream data plane's
(:mod:`.stream_plane`, :mod:`.stream`). The daemon's shared-memory segments are mapped once per client
(:meth:`TierCacheClient.slot_mapping`) and dropped when a re-registration names another segment.

Primitives:
    ClientConfig: deadlines, backoff and channel options (defined in :mod:`.connection`).
    TierCacheClient: connect / close, declare_models, register / registration, slot_mapping, lookup,
        prefetch / start_prefetch / cancel_prefetch, begin_store / commit_store / abort_store, acquire_load /
        release_load / release_load_nowait / defer_release, claim_prefill / wait_prefill / release_prefill,
        report_usage / defer_usage, settle, pin / unpin, purge, stats, stream_store / stream_load, wait_ready.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import TypeVar

from tiercache.codec import Codec
from tiercache.errors import InvalidArgumentError
from tiercache.keys import Namespace
from tiercache.policies.load import DeadlineModel, LoadPolicyKind, PrefillModel, make_load_policy
from tiercache.proto import tiercache_pb2 as pb
from tiercache.stats import CacheStats
from tiercache.tiers.base import TierLevel
from tiercache.wire import CODECS, LOAD_POLICIES, stats_from_proto
from tiercache.wire.framing import Framed

from . import rpcs
from .channel import Endpoint, parse_address
from .connection import ClientConfig, Connection, EngineModels
from .requests import lookup_request
from .results import (
    LoadLease,
    LookupInfo,
    PrefetchInfo,
    PrefillClaimInfo,
    Registration,
    StoreGrant,
    StreamStoreResult,
)
from .segments import SegmentMaps, SlotMapping
from .settle import SETTLE_AFTER_S, PendingSettlements, send_alone, usage_request, usage_settlement

logger = logging.getLogger(__name__)
_Ids = Sequence[int] | None
_Sums = Mapping[int, int] | None

T = TypeVar("T")


class TierCacheClient:
    """A connection to one daemon. Thread-safe; create one per engine process.

    Attributes:
        endpoint: the daemon's address.
        config: deadlines, backoff and channel options.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        token: str | None = None,
        config: ClientConfig | None = None,
        settle_after_s: float = SETTLE_AFTER_S,
    ) -> None:
        """Prepare a client; nothing is dialled until the first call.

        ``settle_after_s``: how long a deferred release or usage report waits for a call to carry it.

        Raises:
            InvalidArgumentError: a malformed token.
        """
        self.endpoint = endpoint
        self.config = config or ClientConfig()
        self._segments = SegmentMaps(token)
        self._conn = Connection(endpoint, token, self.config, on_registered=self._segments.retain)
        self._pending = PendingSettlements(partial(send_alone, self, wait=False), settle_after_s)

    @classmethod
    def connect(
        cls,
        address: str,
        token: str | None = None,
        timeout_s: float = 5.0,
        config: ClientConfig | None = None,
    ) -> TierCacheClient:
        """A client for the daemon at ``address`` (connects lazily: a down daemon fails the first call).

        Args:
            address: ``unix:/path``, ``/path``, ``host:port`` or ``tcp://host:port``.
            token: bearer token when the daemon has a tokens file.
            timeout_s: deadline of each unary call (ignored when ``config`` is given).
            config: full client configuration.

        Raises:
            InvalidArgumentError: a malformed address, token or timeout.
        """
        return cls(parse_address(address), token, config or ClientConfig(timeout_s=timeout_s))

    def __enter__(self) -> TierCacheClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Settle what is queued, close the channel and unmap the shared-memory segments (idempotent)."""
        self._pending.close()
        self.settle()
        self._conn.close()
        self._segments.close()

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait (without polling) until the channel is connected; False after ``timeout_s``."""
        return self._conn.wait_ready(timeout_s)

    # ------------------------------------------------------------------ registration and segments

    def declare_models(
        self,
        namespace: Namespace,
        prefill: PrefillModel | None = None,
        deadline: DeadlineModel | None = None,
    ) -> None:
        """Declare the engine's cost models for ``namespace`` (no call now; sent with the next registration).

        Args:
            namespace: the namespace.
            prefill: the engine's prefill model (needed for cost-aware loads).
            deadline: the engine's load-deadline model (for timeout loads without an explicit timeout).
        """
        self._conn.declare_models(namespace, EngineModels(prefill, deadline))

    def register(self, namespace: Namespace) -> Registration:
        """Register ``namespace`` (again) with the daemon and return what it accepted.

        Raises:
            InvalidArgumentError: the daemon rejected the namespace, or accepted another layout.
            PermissionDeniedError, UnavailableError, DeadlineExceededError: see :mod:`.connection`.
        """
        return self._conn.register(namespace)

    def registration(self, namespace: Namespace) -> Registration:
        """The current registration of ``namespace``, registering it first when needed."""
        return self._conn.registration(namespace)

    def slot_mapping(self, namespace: Namespace) -> SlotMapping | None:
        """The daemon's shared-memory segment mapped into this process, or None when it cannot be.

        None means the byte stream is the only data plane: the daemon has no shared-memory tier, or runs
        on another host (the segment does not exist here). The segment is mapped once per name.
        """
        segment = self.registration(namespace).segment
        return None if segment is None else self._segments.mapping(segment)

    # ------------------------------------------------------------------ control plane

    def lookup(
        self,
        namespace: Namespace,
        keys: Sequence[bytes],
        prefetch: bool = False,
        timeout_s: float | None = None,
    ) -> LookupInfo:
        """Per-tier contiguous cached prefix of ``keys``; ``prefetch`` starts promoting it into L2."""
        # the keys packed into one field for a daemon that reads them so
        build = partial(lookup_request, keys=keys, prefetch=prefetch)
        return LookupInfo.from_proto(self._conn.unary_registered(rpcs.LOOKUP, namespace, build, timeout_s))

    def prefetch(self, namespace: Namespace, keys: Sequence[bytes], wait_s: float = 0.0) -> int:
        """Promote the cached prefix of ``keys`` into L2, waiting up to ``wait_s``; returns the ready prefix."""
        return self.start_prefetch(namespace, keys, wait_s).ready

    def start_prefetch(
        self, namespace: Namespace, keys: Sequence[bytes], wait_s: float = 0.0
    ) -> PrefetchInfo:
        """Like :meth:`prefetch`, also returning the id under which unfinished promotions can be cancelled."""
        resp = self._conn.unary(
            rpcs.PREFETCH,
            namespace,
            lambda h: pb.PrefetchRequest(handle=h, keys=keys, timeout_s=wait_s),
            self.config.timeout_s + max(0.0, wait_s),
        )
        return PrefetchInfo(resp.ready, resp.prefetch_id)

    def cancel_prefetch(self, namespace: Namespace, prefetch_id: int) -> int:
        """Drop the promotions of a prefetch that have not started; returns how many were dropped."""
        resp = self._conn.unary(
            rpcs.CANCEL_PREFETCH,
            namespace,
            lambda h: pb.CancelPrefetchRequest(handle=h, prefetch_id=prefetch_id),
            retry=False,
        )
        return int(resp.cancelled)

    def begin_store(
        self, namespace: Namespace, keys: Sequence[bytes], start_depth: int = 0, ttl_s: float = 0.0
    ) -> StoreGrant:
        """Reserve shared-memory slots for the chunks of ``keys`` not cached yet (fill, then commit); carries
        the namespace's deferred releases and usage (settled first)."""
        settle = self._take_settlement(namespace)
        resp = self._conn.unary(
            rpcs.BEGIN_STORE,
            namespace,
            lambda h: pb.BeginStoreRequest(
                handle=h, keys=keys, start_depth=start_depth, ttl_s=ttl_s, settle=settle
            ),
        )
        return StoreGrant.from_proto(resp)

    def commit_store(
        self, namespace: Namespace, ticket_id: int, indices: _Ids = None, checksums: _Sums = None
    ) -> int:
        """Make a ticket's chunks visible (all left, closing it; or only ``indices``, positions of the keys given
        to ``begin_store``); returns how many were added. ``checksums``: position -> its slot bytes' xxh3-64,
        taken as they were copied: the daemon keeps it instead of hashing the slot again."""
        resp = self._conn.unary(
            rpcs.COMMIT_STORE,
            namespace,
            lambda h: pb.CommitStoreRequest(
                handle=h, ticket_id=ticket_id, indices=indices or (), checksums=checksums
            ),
            retry=False,
        )
        return int(resp.stored)

    def abort_store(self, namespace: Namespace, ticket_id: int) -> bool:
        """Drop a ticket's reservations; False when it was unknown or finished."""
        resp = self._conn.unary(
            rpcs.ABORT_STORE,
            namespace,
            lambda h: pb.AbortStoreRequest(handle=h, ticket_id=ticket_id),
            retry=False,
        )
        return bool(resp.aborted)

    def acquire_load(
        self,
        namespace: Namespace,
        keys: Sequence[bytes],
        ttl_s: float = 0.0,
        policy: LoadPolicyKind = LoadPolicyKind.WAIT_COMPLETE,
        timeout_s: float = 0.0,
        prompt_tokens: int = 0,
        more_chains: Sequence[Sequence[bytes]] = (),
    ) -> LoadLease:
        """Lease the slots of the cached prefix of ``keys`` that ``policy`` chooses (promoted into L2 first), and
        of each of ``more_chains`` (own leases, in ``more``); carries deferred releases and usage (settled first).

        Args:
            namespace: the namespace.
            keys: the prompt's chunk keys.
            ttl_s: lease lifetime (0: the daemon's default).
            policy: WAIT_COMPLETE, BEST_EFFORT, TIMEOUT or COST_AWARE (needs a declared prefill model).
            timeout_s: TIMEOUT: the deadline; 0: from the declared deadline model.
            prompt_tokens: for a deadline from the prompt length (0: the keys' tokens).

        Raises:
            InvalidArgumentError: a TIMEOUT without timeout or deadline model, a COST_AWARE without prefill
                model (naming ``timeout_s`` / ``prefill``).
        """
        settle = self._take_settlement(namespace)
        num_keys = max(map(len, (keys, *more_chains)))  # the chains wait together, from the call's arrival
        resp = self._conn.unary(
            rpcs.ACQUIRE_LOAD,
            namespace,
            lambda h: pb.AcquireLoadRequest(
                handle=h,
                keys=keys,
                ttl_s=ttl_s,
                policy=LOAD_POLICIES.to_proto(policy),
                timeout_s=timeout_s,
                prompt_tokens=prompt_tokens,
                settle=settle,
                more_chains=[pb.KeyChain(keys=more) for more in more_chains],
            ),
            self.config.timeout_s + self._load_wait_s(namespace, num_keys, policy, timeout_s, prompt_tokens),
        )
        return LoadLease.from_proto(resp)

    def _load_wait_s(
        self,
        namespace: Namespace,
        num_keys: int,
        policy: LoadPolicyKind,
        timeout_s: float,
        prompt_tokens: int,
    ) -> float:
        """How long the daemon may wait for promotion under ``policy`` (added to the call's deadline): the
        policy's own wait, resolved against the models declared for the namespace as the daemon does."""
        models = self._conn.models(namespace)
        try:
            load_policy = make_load_policy(policy, timeout_s=timeout_s or None)
            wait = load_policy.resolve(
                models.deadline if models is not None else None,
                models.prefill if models is not None else None,
            ).wait_s(prompt_tokens or num_keys * namespace.layout.chunk_tokens)
        except InvalidArgumentError:
            return 0.0  # the daemon refuses the policy at once
        return wait or 0.0  # wait_complete and cost_aware are bounded by the call's own timeout

    def release_load(self, namespace: Namespace, lease_id: int) -> bool:
        """End a lease; False when it was unknown, released or expired (its slots may have been reused)."""
        resp = self._conn.unary(
            rpcs.RELEASE_LOAD,
            namespace,
            lambda h: pb.ReleaseLoadRequest(handle=h, lease_id=lease_id),
            retry=False,
        )
        return bool(resp.released)

    def release_load_nowait(self, namespace: Namespace, lease_id: int) -> None:
        """End a lease without waiting for the answer (the caller already knows its copy was in time);
        failures are logged, never raised: a lease that is not released lapses at its TTL."""
        self._conn.unary_nowait(
            rpcs.RELEASE_LOAD, namespace, lambda h: pb.ReleaseLoadRequest(handle=h, lease_id=lease_id)
        )

    def defer_release(self, namespace: Namespace, lease_id: int) -> None:
        """End a lease (its copy was in time) with the namespace's next AcquireLoad or BeginStore, or one-way
        after ``settle_after_s``; never raises (a lease not released lapses at its TTL)."""
        self._pending.release(namespace, lease_id)

    def defer_usage(
        self,
        namespace: Namespace,
        effective_chunks: Mapping[TierLevel, int],
        recomputed_tokens: int,
        loaded_tokens: Mapping[TierLevel, int] | None = None,
        effective_tokens: Mapping[TierLevel, int] | None = None,
        read_keys: Iterable[bytes] = (),
    ) -> None:
        """:meth:`report_usage` (and ``read_keys``), carried like :meth:`defer_release` (queued ones summed)."""
        usage = (effective_chunks, recomputed_tokens, loaded_tokens, effective_tokens, read_keys)
        self._pending.usage(namespace, *usage)

    def _take_settlement(self, namespace: Namespace) -> pb.Settlement | None:
        """What a call of ``namespace`` carries; the other namespaces' queued settlements go one-way now."""
        for other, message in self._pending.take_others(namespace):
            send_alone(self, other, message, wait=False)
        return self._pending.take(namespace)

    def settle(self) -> None:
        """Send every deferred release and usage report now and wait for them (failures are logged)."""
        for namespace, message in self._pending.take_all():
            send_alone(self, namespace, message, wait=True)

    def claim_prefill(
        self, namespace: Namespace, keys: Sequence[bytes], ttl_s: float = 0.0
    ) -> PrefillClaimInfo:
        """Claim the uncached chunks of ``keys`` nobody computes yet (single-flight prefill).

        Args:
            namespace: the namespace.
            keys: the prompt's chunk keys.
            ttl_s: claim lifetime, renewed by each publication (0: the daemon's lease TTL).
        """
        resp = self._conn.unary(
            rpcs.CLAIM_PREFILL,
            namespace,
            lambda h: pb.ClaimPrefillRequest(handle=h, keys=keys, ttl_s=ttl_s),
            retry=False,
        )
        return PrefillClaimInfo.from_proto(resp)

    def wait_prefill(
        self, namespace: Namespace, keys: Sequence[bytes], timeout_s: float, claim_id: int = 0
    ) -> int:
        """Wait until the chunks others compute for ``keys`` are published, their leader is gone, or the timeout.

        Returns:
            The contiguous cached prefix of ``keys`` (chunks) when the wait ended.
        """
        resp = self._conn.unary(
            rpcs.WAIT_PREFILL,
            namespace,
            lambda h: pb.WaitPrefillRequest(handle=h, keys=keys, timeout_s=timeout_s, claim_id=claim_id),
            self.config.timeout_s + max(0.0, timeout_s),
        )
        return int(resp.cached)

    def release_prefill(self, namespace: Namespace, claim_id: int) -> int:
        """Give a prefill claim up (its unpublished chunks may be taken over); returns chunks released."""
        resp = self._conn.unary(
            rpcs.RELEASE_PREFILL,
            namespace,
            lambda h: pb.ReleasePrefillRequest(handle=h, claim_id=claim_id),
            retry=False,
        )
        return int(resp.released)

    def report_usage(
        self,
        namespace: Namespace,
        effective_chunks: Mapping[TierLevel, int],
        recomputed_tokens: int,
        wait: bool = True,
        loaded_tokens: Mapping[TierLevel, int] | None = None,
        effective_tokens: Mapping[TierLevel, int] | None = None,
        read_keys: Iterable[bytes] = (),
    ) -> None:
        """Tell the daemon what a load was worth (:meth:`~.settle.PendingSettlements.usage`; the daemon counts
        loaded tokens only from these); ``wait=False``: without waiting (failures are logged)."""
        usage = (effective_chunks, recomputed_tokens, loaded_tokens, effective_tokens, read_keys)
        s = usage_settlement(namespace, *usage)
        if wait:
            self._conn.unary(rpcs.REPORT_USAGE, namespace, partial(usage_request, settlement=s), retry=False)
        else:
            self._conn.unary_nowait(rpcs.REPORT_USAGE, namespace, partial(usage_request, settlement=s))

    def pin(self, namespace: Namespace, keys: Sequence[bytes] | None = None) -> int:
        """Pin chunks (all of the namespace when ``keys`` is None); returns how many."""
        resp = self._conn.unary(rpcs.PIN, namespace, lambda h: pb.PinRequest(handle=h, keys=keys or ()))
        return int(resp.chunks)

    def unpin(self, namespace: Namespace, keys: Sequence[bytes] | None = None) -> int:
        """Unpin chunks (all of the namespace when ``keys`` is None); returns how many."""
        resp = self._conn.unary(rpcs.UNPIN, namespace, lambda h: pb.PinRequest(handle=h, keys=keys or ()))
        return int(resp.chunks)

    def purge(self, namespace: Namespace) -> int:
        """Remove every chunk of the namespace from every tier (after settling); returns how many."""
        self.settle()
        resp = self._conn.unary(rpcs.PURGE, namespace, lambda h: pb.PurgeRequest(handle=h))
        return int(resp.removed)

    def stats(self) -> CacheStats:
        """A snapshot of the daemon's tiers and counters (the core's schema, :mod:`tiercache.stats`).

        Deferred releases and usage reports are settled first, so that the snapshot counts them.

        Raises:
            InvalidArgumentError: the daemon reports a tier this connector does not know.
        """
        self.settle()
        resp = self._conn.unary(rpcs.STATS, None, lambda _h: pb.StatsRequest())
        return stats_from_proto(resp)

    # ------------------------------------------------------------------ byte stream

    def stream_store(
        self, namespace: Namespace, messages: Callable[[bytes], Iterator[Framed[pb.StreamStoreMessage]]]
    ) -> StreamStoreResult:
        """Send a byte-stream store (committed by the daemon when the stream ends); never retried.

        Args:
            namespace: the namespace.
            messages: the framed pieces for a handle, consumed lazily (:func:`~.stream.store_frames`).

        Raises:
            UnavailableError, DeadlineExceededError, ...: daemon failures. An exception raised by
                ``messages`` itself is re-raised as is.
        """
        resp = self._conn.client_stream(rpcs.STREAM_STORE, namespace, messages)
        return StreamStoreResult(resp.stored, tuple(resp.skipped))

    def stream_load(
        self,
        namespace: Namespace,
        keys: Sequence[bytes],
        read: Callable[[Iterator[Framed[pb.StreamLoadMessage]]], T],
        codec: Codec = Codec.RAW,
        max_message_bytes: int = 0,
    ) -> T:
        """Receive the contiguous cached prefix of ``keys`` over the byte stream; ``read`` consumes the
        messages (see :class:`~.stream.StreamAssembler`) and its result is returned.

        Args:
            namespace: the namespace.
            keys: the prompt's chunk keys.
            read: consumes the message stream; when it raises, the call is cancelled (the daemon releases
                its lease at once) and the exception propagates.
            codec: RAW, or ZSTD for the daemon to compress pieces where it pays.
            max_message_bytes: the largest message to receive (0: the daemon's limit).

        Raises:
            UnavailableError, DeadlineExceededError, ...: daemon failures.
        """

        def build(handle: bytes) -> pb.StreamLoadRequest:
            return pb.StreamLoadRequest(
                handle=handle, keys=keys, codec=CODECS.to_proto(codec), max_message_bytes=max_message_bytes
            )

        return self._conn.server_stream(rpcs.STREAM_LOAD, namespace, build, read)
