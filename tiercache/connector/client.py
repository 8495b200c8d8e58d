"""The engine-side gRPC client of the tiercache daemon.

Every call carries a deadline and fails with a typed :mod:`tiercache.errors` exception. The client heals
itself: when a call fails with UNAVAILABLE (daemon down or restarting) it drops the channel and backs off
(calls fail at once, without touching the network, until the next attempt is due); the next attempt opens
a fresh channel and registers every namespace again before using it. A NOT_FOUND for the handle (a
restarted daemon that has not seen this engine yet) also triggers re-registration, and idempotent calls are
retried once. Handles are deterministic, so the same bytes come back; the shared-memory segment may change
and is re-mapped.

Namespaces are registered on first use (or explicitly with :meth:`TierCacheClient.register`); every call
takes the :class:`~tiercache.keys.Namespace` and looks up its current handle. The engine's cost models
(prefill model for cost-aware loads, deadline model for timeout loads) are declared per namespace with
:meth:`TierCacheClient.declare_models` and sent with every (re-)registration.

Primitives:
    ClientConfig: deadlines, backoff and channel options.
    TierCacheClient: connect, declare_models, register, lookup, prefetch / start_prefetch /
        cancel_prefetch, begin_store / commit_store / abort_store, acquire_load / release_load,
        claim_prefill / wait_prefill / release_prefill, report_usage, stream_store / stream_load,
        pin / unpin, purge, stats, slot_mapping, wait_ready, close.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import grpc
import torch

from tiercache.codec import Codec
from tiercache.errors import (
    DeadlineExceededError,
    InvalidArgumentError,
    NotFoundError,
    TierCacheError,
    UnavailableError,
)
from tiercache.keys import Namespace
from tiercache.policies.load import DeadlineModel, LoadPolicyKind, PrefillModel, make_load_policy
from tiercache.proto import tiercache_pb2 as pb
from tiercache.proto.tiercache_pb2_grpc import KVCacheServiceStub
from tiercache.stats import CacheStats
from tiercache.stats_wire import stats_from_proto
from tiercache.tiers.base import TierLevel

from .backoff import Backoff, BackoffConfig
from .channel import ChannelConfig, Endpoint, auth_metadata, open_channel, parse_address
from .dataplane import SlotMapping
from .errors import error_from_rpc, is_lost_handle
from .results import (
    LoadLease,
    LookupInfo,
    PrefetchInfo,
    PrefillClaimInfo,
    Registration,
    StoreTicket,
    StreamChunk,
    StreamStoreResult,
)
from .stream import (
    DEFAULT_MESSAGE_BYTES,
    StreamAssembler,
    piece_bytes,
    store_messages,
)
from .wire import codec_to_proto, deadline_to_proto, namespace_to_proto, prefill_to_proto

logger = logging.getLogger(__name__)

T = TypeVar("T")
Payload = torch.Tensor | bytes | bytearray | memoryview
"""One raw chunk for a stream store: a 1-D CPU uint8 tensor or any bytes-like object."""

_POLICIES: dict[LoadPolicyKind, pb.LoadPolicy] = {
    LoadPolicyKind.WAIT_COMPLETE: pb.LOAD_POLICY_WAIT_COMPLETE,
    LoadPolicyKind.BEST_EFFORT: pb.LOAD_POLICY_BEST_EFFORT,
    LoadPolicyKind.TIMEOUT: pb.LOAD_POLICY_TIMEOUT,
    LoadPolicyKind.COST_AWARE: pb.LOAD_POLICY_COST_AWARE,
}


@dataclass(frozen=True, slots=True)
class _Models:
    prefill: PrefillModel | None
    deadline: DeadlineModel | None


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """Deadlines, reconnect backoff and channel options of a client.

    Attributes:
        timeout_s: deadline of a unary call.
        stream_timeout_s: deadline of a whole byte-stream call.
        engine_id: sent with every registration (for the daemon's logs).
        backoff: delay between connection attempts after a failure.
        channel: gRPC channel options.
    """

    timeout_s: float = 5.0
    stream_timeout_s: float = 60.0
    engine_id: str = ""
    backoff: BackoffConfig = field(default_factory=BackoffConfig)
    channel: ChannelConfig = field(default_factory=ChannelConfig)

    def __post_init__(self) -> None:
        for name in ("timeout_s", "stream_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise InvalidArgumentError(name, f"must be > 0, got {value!r}")


def _as_memoryview(payload: Payload, index: int) -> memoryview:
    if isinstance(payload, torch.Tensor):
        if payload.device.type != "cpu" or payload.dtype != torch.uint8 or payload.dim() != 1:
            raise InvalidArgumentError(f"payloads[{index}]", "must be a 1-D uint8 CPU tensor")
        return payload.contiguous().numpy().data
    return memoryview(payload)


class TierCacheClient:
    """A connection to one daemon. Thread-safe; create one per engine process.

    Attributes:
        endpoint: the daemon's address.
        config: deadlines, backoff and channel options.
    """

    def __init__(
        self, endpoint: Endpoint, token: str | None = None, config: ClientConfig | None = None
    ) -> None:
        """Prepare a client; nothing is dialled until the first call.

        Raises:
            InvalidArgumentError: a malformed token.
        """
        self.endpoint = endpoint
        self.config = config or ClientConfig()
        self._metadata = auth_metadata(token)
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._stub: Any = None
        self._generation = 0
        self._backoff = Backoff(self.config.backoff)
        self._registrations: dict[Namespace, Registration] = {}
        self._models: dict[Namespace, _Models] = {}
        self._stale: set[Namespace] = set()
        self._mappings: dict[str, SlotMapping | None] = {}
        self._closed = False

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
        """Close the channel and unmap the data plane (idempotent)."""
        with self._lock:
            self._closed = True
            channel, self._channel, self._stub = self._channel, None, None
            mappings = [m for m in self._mappings.values() if m is not None]
            self._mappings.clear()
        if channel is not None:
            channel.close()
        for mapping in mappings:
            mapping.retire()

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait (without polling) until the channel is connected; False after ``timeout_s``."""
        self._stub_or_fail("wait_ready", ignore_backoff=True)
        with self._lock:
            channel = self._channel
        if channel is None:
            return False
        try:
            grpc.channel_ready_future(channel).result(timeout=timeout_s)
        except grpc.FutureTimeoutError:
            return False
        return True

    # ------------------------------------------------------------------ registration and data plane

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
        models = _Models(prefill, deadline)
        with self._lock:
            if self._models.get(namespace) == models:
                return
            self._models[namespace] = models
            if namespace in self._registrations:
                self._stale.add(namespace)  # register again with the new models

    def register(self, namespace: Namespace) -> Registration:
        """Register ``namespace`` (again) with the daemon and return what it accepted.

        Raises:
            InvalidArgumentError: the daemon rejected the namespace, or accepted another layout.
            PermissionDeniedError, UnavailableError, DeadlineExceededError: see the module docstring.
        """
        stub, generation = self._stub_or_fail("Register")
        return self._register(namespace, stub, generation)

    def registration(self, namespace: Namespace) -> Registration:
        """The current registration of ``namespace``, registering it first when needed."""
        stub, generation = self._stub_or_fail("Register")
        self._handle(namespace, stub, generation)
        with self._lock:
            return self._registrations[namespace]

    def slot_mapping(self, namespace: Namespace) -> SlotMapping | None:
        """The daemon's shared-memory segment mapped into this process, or None when it cannot be.

        None means the byte stream is the only data plane: the daemon has no shared-memory tier, or runs
        on another host (the segment does not exist here). The segment is mapped once per name.
        """
        reg = self.registration(namespace)
        plane = reg.data_plane
        if plane is None:
            return None
        with self._lock:
            if plane.shm_segment in self._mappings:
                return self._mappings[plane.shm_segment]
        mapping: SlotMapping | None
        try:
            mapping = SlotMapping.attach(plane)
        except (NotFoundError, InvalidArgumentError, OSError) as exc:
            logger.info(
                "shared-memory segment %s not usable here (%s); using the byte stream", plane.shm_segment, exc
            )
            mapping = None
        with self._lock:
            existing = self._mappings.setdefault(plane.shm_segment, mapping)
        if existing is not mapping and mapping is not None:
            mapping.retire()
        return existing

    # ------------------------------------------------------------------ control plane

    def lookup(
        self,
        namespace: Namespace,
        keys: Sequence[bytes],
        prefetch: bool = False,
        timeout_s: float | None = None,
    ) -> LookupInfo:
        """Per-tier contiguous cached prefix of ``keys``; ``prefetch`` starts promoting it into L2."""
        resp = self._unary(
            "Lookup",
            namespace,
            lambda h: pb.LookupRequest(handle=h, keys=keys, prefetch=prefetch),
            timeout_s,
        )
        return LookupInfo.from_proto(cast(pb.LookupResponse, resp))

    def prefetch(self, namespace: Namespace, keys: Sequence[bytes], wait_s: float = 0.0) -> int:
        """Promote the cached prefix of ``keys`` into L2, waiting up to ``wait_s``; returns the ready prefix."""
        return self.start_prefetch(namespace, keys, wait_s).ready

    def start_prefetch(
        self, namespace: Namespace, keys: Sequence[bytes], wait_s: float = 0.0
    ) -> PrefetchInfo:
        """Like :meth:`prefetch`, also returning the id under which unfinished promotions can be cancelled."""
        resp = cast(
            pb.PrefetchResponse,
            self._unary(
                "Prefetch",
                namespace,
                lambda h: pb.PrefetchRequest(handle=h, keys=keys, timeout_s=wait_s),
                self.config.timeout_s + max(0.0, wait_s),
            ),
        )
        return PrefetchInfo(resp.ready, resp.prefetch_id)

    def cancel_prefetch(self, namespace: Namespace, prefetch_id: int) -> int:
        """Drop the promotions of a prefetch that have not started; returns how many were dropped."""
        resp = self._unary(
            "CancelPrefetch",
            namespace,
            lambda h: pb.CancelPrefetchRequest(handle=h, prefetch_id=prefetch_id),
            retry=False,
        )
        return int(cast(pb.CancelPrefetchResponse, resp).cancelled)

    def begin_store(
        self, namespace: Namespace, keys: Sequence[bytes], start_depth: int = 0, ttl_s: float = 0.0
    ) -> StoreTicket:
        """Reserve shared-memory slots for the chunks of ``keys`` not cached yet (fill, then commit)."""
        resp = self._unary(
            "BeginStore",
            namespace,
            lambda h: pb.BeginStoreRequest(handle=h, keys=keys, start_depth=start_depth, ttl_s=ttl_s),
        )
        return StoreTicket.from_proto(cast(pb.BeginStoreResponse, resp))

    def commit_store(self, namespace: Namespace, ticket_id: int, indices: Sequence[int] | None = None) -> int:
        """Make a ticket's chunks visible; returns how many were added.

        Args:
            namespace: the namespace.
            ticket_id: the ticket.
            indices: publish only these positions (of the keys given to ``begin_store``); the ticket stays
                open for the rest. None: all that are left, closing the ticket.
        """
        resp = self._unary(
            "CommitStore",
            namespace,
            lambda h: pb.CommitStoreRequest(handle=h, ticket_id=ticket_id, indices=indices or ()),
            retry=False,
        )
        return int(cast(pb.CommitStoreResponse, resp).stored)

    def abort_store(self, namespace: Namespace, ticket_id: int) -> bool:
        """Drop a ticket's reservations; False when it was unknown or finished."""
        resp = self._unary(
            "AbortStore",
            namespace,
            lambda h: pb.AbortStoreRequest(handle=h, ticket_id=ticket_id),
            retry=False,
        )
        return bool(cast(pb.AbortStoreResponse, resp).aborted)

    def acquire_load(
        self,
        namespace: Namespace,
        keys: Sequence[bytes],
        ttl_s: float = 0.0,
        policy: LoadPolicyKind = LoadPolicyKind.WAIT_COMPLETE,
        timeout_s: float = 0.0,
        prompt_tokens: int = 0,
    ) -> LoadLease:
        """Lease the slots of the cached prefix of ``keys`` that ``policy`` chooses (promoted into L2 first).

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
        resp = self._unary(
            "AcquireLoad",
            namespace,
            lambda h: pb.AcquireLoadRequest(
                handle=h,
                keys=keys,
                ttl_s=ttl_s,
                policy=_POLICIES[policy],
                timeout_s=timeout_s,
                prompt_tokens=prompt_tokens,
            ),
            self.config.timeout_s + self._load_wait_s(namespace, len(keys), policy, timeout_s, prompt_tokens),
        )
        return LoadLease.from_proto(cast(pb.AcquireLoadResponse, resp))

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
        with self._lock:
            models = self._models.get(namespace) or _Models(None, None)
        try:
            load_policy = make_load_policy(policy, timeout_s=timeout_s or None)
            wait = load_policy.resolve(models.deadline, models.prefill).wait_s(
                prompt_tokens or num_keys * namespace.layout.chunk_tokens
            )
        except InvalidArgumentError:
            return 0.0  # the daemon refuses the policy at once
        return wait or 0.0  # wait_complete and cost_aware are bounded by the call's own timeout

    def release_load(self, namespace: Namespace, lease_id: int) -> bool:
        """End a lease; False when it was unknown, released or expired (its slots may have been reused)."""
        resp = self._unary(
            "ReleaseLoad",
            namespace,
            lambda h: pb.ReleaseLoadRequest(handle=h, lease_id=lease_id),
            retry=False,
        )
        return bool(cast(pb.ReleaseLoadResponse, resp).released)

    def release_load_nowait(self, namespace: Namespace, lease_id: int) -> None:
        """End a lease without waiting for the answer (the caller already knows its copy was in time).

        Failures are logged, never raised: a lease that is not released lapses at its TTL.
        """
        self._unary_nowait(
            "ReleaseLoad", namespace, lambda h: pb.ReleaseLoadRequest(handle=h, lease_id=lease_id)
        )

    def claim_prefill(
        self, namespace: Namespace, keys: Sequence[bytes], ttl_s: float = 0.0
    ) -> PrefillClaimInfo:
        """Claim the uncached chunks of ``keys`` nobody computes yet (single-flight prefill).

        Args:
            namespace: the namespace.
            keys: the prompt's chunk keys.
            ttl_s: claim lifetime, renewed by each publication (0: the daemon's lease TTL).
        """
        resp = self._unary(
            "ClaimPrefill",
            namespace,
            lambda h: pb.ClaimPrefillRequest(handle=h, keys=keys, ttl_s=ttl_s),
            retry=False,
        )
        return PrefillClaimInfo.from_proto(cast(pb.ClaimPrefillResponse, resp))

    def wait_prefill(
        self, namespace: Namespace, keys: Sequence[bytes], timeout_s: float, claim_id: int = 0
    ) -> int:
        """Wait until the chunks others compute for ``keys`` are published, their leader is gone, or the timeout.

        Returns:
            The contiguous cached prefix of ``keys`` (chunks) when the wait ended.
        """
        resp = self._unary(
            "WaitPrefill",
            namespace,
            lambda h: pb.WaitPrefillRequest(handle=h, keys=keys, timeout_s=timeout_s, claim_id=claim_id),
            self.config.timeout_s + max(0.0, timeout_s),
        )
        return int(cast(pb.WaitPrefillResponse, resp).cached)

    def release_prefill(self, namespace: Namespace, claim_id: int) -> int:
        """Give a prefill claim up (its unpublished chunks may be taken over); returns chunks released."""
        resp = self._unary(
            "ReleasePrefill",
            namespace,
            lambda h: pb.ReleasePrefillRequest(handle=h, claim_id=claim_id),
            retry=False,
        )
        return int(cast(pb.ReleasePrefillResponse, resp).released)

    def report_usage(
        self,
        namespace: Namespace,
        effective_chunks: Mapping[TierLevel, int],
        recomputed_tokens: int,
        wait: bool = True,
    ) -> None:
        """Tell the daemon what a load was worth: chunks whose prefill was skipped per source tier, and
        looked-up tokens recomputed anyway. With ``wait=False`` the report is sent without waiting for the
        answer (off the engine's critical path; failures are logged)."""
        counts = [
            pb.TierCount(tier=cast(pb.Tier, int(t)), chunks=n) for t, n in effective_chunks.items() if n > 0
        ]

        def build(h: bytes) -> pb.ReportUsageRequest:
            return pb.ReportUsageRequest(
                handle=h, effective_chunks=counts, recomputed_tokens=recomputed_tokens
            )

        if wait:
            self._unary("ReportUsage", namespace, build, retry=False)
        else:
            self._unary_nowait("ReportUsage", namespace, build)

    def pin(self, namespace: Namespace, keys: Sequence[bytes] | None = None) -> int:
        """Pin chunks (all of the namespace when ``keys`` is None); returns how many."""
        resp = self._unary("Pin", namespace, lambda h: pb.PinRequest(handle=h, keys=keys or ()))
        return int(cast(pb.PinResponse, resp).chunks)

    def unpin(self, namespace: Namespace, keys: Sequence[bytes] | None = None) -> int:
        """Unpin chunks (all of the namespace when ``keys`` is None); returns how many."""
        resp = self._unary("Unpin", namespace, lambda h: pb.PinRequest(handle=h, keys=keys or ()))
        return int(cast(pb.PinResponse, resp).chunks)

    def purge(self, namespace: Namespace) -> int:
        """Remove every chunk of the namespace from every tier; returns how many."""
        resp = self._unary("Purge", namespace, lambda h: pb.PurgeRequest(handle=h))
        return int(cast(pb.PurgeResponse, resp).removed)

    def stats(self) -> CacheStats:
        """A snapshot of the daemon's tiers and counters (the core's schema, :mod:`tiercache.stats`).

        Raises:
            InvalidArgumentError: the daemon reports a tier this connector does not know.
        """
        resp = self._unary("Stats", None, lambda _h: pb.StatsRequest())
        return stats_from_proto(cast(pb.StatsResponse, resp))

    # ------------------------------------------------------------------ byte-stream data plane

    def stream_store(
        self,
        namespace: Namespace,
        keys: Sequence[bytes],
        payloads: Iterable[Payload],
        start_depth: int = 0,
        codec: Codec = Codec.RAW,
    ) -> StreamStoreResult:
        """Store whole chunks over the byte stream (no shared memory); committed when the stream ends.

        Args:
            namespace: the namespace.
            keys: chunk keys; ``keys[0]`` is at chain depth ``start_depth``.
            payloads: one raw chunk per key, consumed lazily while the stream is sent.
            start_depth: chain depth of ``keys[0]``.
            codec: RAW, or ZSTD to compress pieces (level 1) where it pays.

        Raises:
            InvalidArgumentError: a payload of the wrong size (also raised when the engine's payload
                iterator raised: its exception is re-raised as is).
            UnavailableError, DeadlineExceededError, ...: daemon failures.
        """
        if not keys:
            return StreamStoreResult(0, ())
        reg = self.registration(namespace)
        limit = min(
            reg.max_stream_message_bytes or DEFAULT_MESSAGE_BYTES, self.config.channel.max_message_bytes
        )
        piece = piece_bytes(limit)
        failures: list[BaseException] = []

        def messages(handle: bytes) -> Iterator[pb.StreamStoreMessage]:
            views = (_as_memoryview(p, i) for i, p in enumerate(payloads))
            try:
                yield from store_messages(handle, keys, views, reg.chunk_bytes, piece, codec, start_depth)
            except BaseException as exc:
                failures.append(exc)
                raise

        def run(stub: Any, handle: bytes) -> pb.StreamStoreResponse:
            try:
                resp = stub.StreamStore(
                    messages(handle), timeout=self.config.stream_timeout_s, metadata=self._metadata
                )
            except grpc.RpcError:
                if failures:
                    raise failures[0] from None
                raise
            return cast(pb.StreamStoreResponse, resp)

        resp = self._call("StreamStore", namespace, run, retry=False)
        return StreamStoreResult(resp.stored, tuple(resp.skipped))

    def stream_load(
        self, namespace: Namespace, keys: Sequence[bytes], codec: Codec = Codec.RAW
    ) -> list[StreamChunk]:
        """Receive the contiguous cached prefix of ``keys`` over the byte stream, as whole raw chunks.

        Raises:
            TierCacheError: the stream was malformed (out-of-order pieces, bad sizes or zstd data).
            UnavailableError, DeadlineExceededError, ...: daemon failures.
        """
        chunks: list[StreamChunk] = []
        self._stream_load(namespace, keys, chunks.append, codec, reuse_buffer=False)
        return chunks

    def stream_load_into(
        self,
        namespace: Namespace,
        keys: Sequence[bytes],
        consume: Callable[[StreamChunk], None],
        codec: Codec = Codec.RAW,
    ) -> int:
        """Like :meth:`stream_load`, handing each chunk to ``consume`` as soon as it is complete.

        Every chunk is assembled in the same buffer: ``consume`` must be done with ``chunk.data`` when it
        returns (copy it into the engine's tensors). Returns the number of chunks consumed.

        Raises:
            TierCacheError: the stream was malformed (out-of-order pieces, bad sizes or zstd data).
            UnavailableError, DeadlineExceededError, ...: daemon failures.
        """
        return self._stream_load(namespace, keys, consume, codec, reuse_buffer=True)

    def _stream_load(
        self,
        namespace: Namespace,
        keys: Sequence[bytes],
        consume: Callable[[StreamChunk], None],
        codec: Codec,
        reuse_buffer: bool,
    ) -> int:
        if not keys:
            return 0
        reg = self.registration(namespace)
        limit = min(
            reg.max_stream_message_bytes or DEFAULT_MESSAGE_BYTES, self.config.channel.max_message_bytes
        )

        def run(stub: Any, handle: bytes) -> int:
            request = pb.StreamLoadRequest(
                handle=handle, keys=keys, codec=codec_to_proto(codec), max_message_bytes=limit
            )
            assembler = StreamAssembler(keys, reg.chunk_bytes, reuse_buffer)
            count = 0
            call = stub.StreamLoad(request, timeout=self.config.stream_timeout_s, metadata=self._metadata)
            try:
                for msg in call:
                    chunk = assembler.feed(msg)
                    if chunk is not None:
                        consume(chunk)
                        count += 1
                assembler.finish()
            except BaseException:
                call.cancel()  # malformed, or the consumer failed: stop now so that the daemon releases its lease
                raise
            return count

        result: int = self._call("StreamLoad", namespace, run)
        return result

    # ------------------------------------------------------------------ internals

    def _unary(
        self,
        method: str,
        namespace: Namespace | None,
        build: Callable[[bytes], Any],
        timeout_s: float | None = None,
        retry: bool = True,
    ) -> Any:
        deadline = timeout_s if timeout_s is not None else self.config.timeout_s

        def run(stub: Any, handle: bytes) -> Any:
            return getattr(stub, method)(build(handle), timeout=deadline, metadata=self._metadata)

        return self._call(method, namespace, run, retry)

    def _unary_nowait(self, method: str, namespace: Namespace, build: Callable[[bytes], Any]) -> None:
        """Send one unary call and return at once; its failure is only logged.

        The connection state is left to the next waited call: the callback runs on a gRPC thread, which
        must not close the channel it belongs to.
        """
        try:
            stub, generation = self._stub_or_fail(method)
            handle = self._handle(namespace, stub, generation)
        except TierCacheError as exc:
            logger.info("%s not sent (%s)", method, exc)
            return
        call = getattr(stub, method).future(
            build(handle), timeout=self.config.timeout_s, metadata=self._metadata
        )

        def done(fut: Any) -> None:
            if fut.cancelled():
                return
            exc = fut.exception()
            if isinstance(exc, grpc.RpcError):
                logger.info("%s failed (%s)", method, error_from_rpc(exc, method))

        call.add_done_callback(done)

    def _call(
        self, method: str, namespace: Namespace | None, run: Callable[[Any, bytes], T], retry: bool = True
    ) -> T:
        """Run one RPC with the current stub and handle; map failures; retry once after a lost handle."""
        attempts = 2 if retry and namespace is not None else 1
        for attempt in range(attempts):
            stub, generation = self._stub_or_fail(method)
            handle = self._handle(namespace, stub, generation) if namespace is not None else b""
            try:
                result = run(stub, handle)
            except grpc.RpcError as exc:
                error = self._failed(exc, method, generation, namespace)
                if attempt + 1 < attempts and is_lost_handle(error):
                    logger.info("%s: daemon lost the handle (restarted?); registering again", method)
                    continue
                raise error from None
            self._succeeded()
            return result
        raise AssertionError("unreachable")  # pragma: no cover

    def _stub_or_fail(self, method: str, ignore_backoff: bool = False) -> tuple[Any, int]:
        with self._lock:
            if self._closed:
                raise UnavailableError(f"{method}: the client is closed")
            wait = self._backoff.remaining_s()
            if wait > 0 and not ignore_backoff:
                raise UnavailableError(
                    f"{method}: daemon at {self.endpoint.target} unavailable; next attempt in {wait:.2f}s"
                )
            if self._stub is None:
                self._channel = open_channel(self.endpoint, self.config.channel)
                self._stub = KVCacheServiceStub(self._channel)
                self._generation += 1
                self._stale.update(self._registrations)
            return self._stub, self._generation

    def _handle(self, namespace: Namespace, stub: Any, generation: int) -> bytes:
        with self._lock:
            reg = self._registrations.get(namespace)
            if reg is not None and namespace not in self._stale:
                return reg.handle
        return self._register(namespace, stub, generation).handle

    def _register(self, namespace: Namespace, stub: Any, generation: int) -> Registration:
        with self._lock:
            models = self._models.get(namespace)
        request = pb.RegisterRequest(namespace=namespace_to_proto(namespace), engine_id=self.config.engine_id)
        if models is not None and models.prefill is not None:
            request.prefill.CopyFrom(prefill_to_proto(models.prefill))
        if models is not None and models.deadline is not None:
            request.deadline.CopyFrom(deadline_to_proto(models.deadline))
        try:
            resp = stub.Register(request, timeout=self.config.timeout_s, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise self._failed(exc, "Register", generation, None) from None
        reg = Registration.from_proto(cast(pb.RegisterResponse, resp))
        if reg.layout != namespace.layout or reg.chunk_bytes != namespace.layout.chunk_bytes:
            raise InvalidArgumentError(
                "layout",
                f"the daemon accepted {reg.layout} ({reg.chunk_bytes} bytes per chunk), the namespace has"
                f" {namespace.layout} ({namespace.layout.chunk_bytes})",
            )
        with self._lock:
            again = namespace in self._registrations
            self._registrations[namespace] = reg
            self._stale.discard(namespace)
            in_use = {r.data_plane.shm_segment for r in self._registrations.values() if r.data_plane}
            retired = [self._mappings.pop(n) for n in list(self._mappings) if n not in in_use]
        for mapping in retired:
            if mapping is not None:
                mapping.retire()
        logger.info(
            "%s namespace %s (handle %s, segment %s)",
            "re-registered" if again else "registered",
            namespace.model_id,
            reg.handle.hex()[:16],
            reg.data_plane.shm_segment if reg.data_plane else None,
        )
        self._succeeded()
        return reg

    def _failed(
        self, exc: grpc.RpcError, method: str, generation: int, namespace: Namespace | None
    ) -> TierCacheError:
        """Map a failed call to its typed error and update the connection state."""
        error = error_from_rpc(exc, method)
        dropped: grpc.Channel | None = None
        with self._lock:
            if (
                isinstance(error, (UnavailableError, DeadlineExceededError))
                and generation == self._generation
            ):
                delay = self._backoff.failed()
                if isinstance(error, UnavailableError):
                    # Drop the channel: the next attempt dials afresh (the daemon may be a new process).
                    dropped, self._channel, self._stub = self._channel, None, None
                    self._stale.update(self._registrations)
                logger.warning("%s failed (%s); next attempt in %.2fs", method, error, delay)
            elif namespace is not None and is_lost_handle(error):
                self._stale.add(namespace)
        if dropped is not None:
            dropped.close()
        return error

    def _succeeded(self) -> None:
        with self._lock:
            self._backoff.succeeded()
