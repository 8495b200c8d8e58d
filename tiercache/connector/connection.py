"""The connection to one daemon: channel, deadlines, typed errors, backoff and re-registration.

Every call carries a deadline and fails with a typed :mod:`tiercache.errors` exception (mapped in
:mod:`.errors`). The connection heals itself: when a call fails with UNAVAILABLE (daemon down or
restarting) it drops the channel and backs off (:mod:`.backoff`: calls fail at once, without touching the
network, until the next attempt is due); the next attempt opens a fresh channel — a new *generation* — and
registers every namespace again before using it. A NOT_FOUND for the handle (a restarted daemon that has
not seen this engine yet) also triggers re-registration, and idempotent calls are retried once. Handles are
deterministic, so the same bytes come back; the shared-memory segment may change (the ``on_registered``
callback hears which segments are in use after each registration).

When the daemon names a control socket (a same-host daemon), unary calls go over it instead of gRPC
(:mod:`.control`: ~0.4-0.8 ms a call against gRPC's ~1.5-2 ms after idle), with the same errors, backoff and
re-registration; a control socket that cannot be reached sends the calls back to gRPC.

Namespaces are registered on first use; the handle cache maps each :class:`~tiercache.keys.Namespace` to
its current :class:`~.results.Registration`. The engine's cost models are declared per namespace and sent
with every (re-)registration.

Primitives:
    ClientConfig: deadlines, backoff and channel options.
    EngineModels: the cost models declared for a namespace.
    Connection: unary / unary_registered / unary_nowait / client_stream / server_stream (one RPC, mapped
        errors, one retry after a lost handle), register / registration, declare_models / models,
        wait_ready, close.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import grpc

from tiercache.errors import (
    DeadlineExceededError,
    InvalidArgumentError,
    TierCacheError,
    UnavailableError,
)
from tiercache.keys import Namespace
from tiercache.policies.load import DeadlineModel, PrefillModel
from tiercache.proto import tiercache_pb2 as pb
from tiercache.proto.tiercache_pb2_grpc import DiagnosticsStub, KVCacheServiceStub
from tiercache.wire import deadline_to_proto, namespace_to_proto, prefill_to_proto
from tiercache.wire.framing import Framed

from .backoff import Backoff, BackoffConfig
from .channel import ChannelConfig, Endpoint, auth_metadata, open_channel
from .control import ControlSocket, ControlUnreachable
from .errors import error_from_rpc, is_lost_handle
from .feed import RequestFeed
from .results import Registration
from .rpcs import REGISTER, Metadata, Req, Resp, StreamUnaryRpc, UnaryRpc, UnaryStreamRpc
from .stub import ServiceStub

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """Deadlines, reconnect backoff and channel options of a client.

    Attributes:
        timeout_s: deadline of a unary call.
        stream_timeout_s: deadline of a whole byte-stream call.
        engine_id: sent with every registration (for the daemon's logs).
        backoff: delay between connection attempts after a failure.
        channel: gRPC channel options.
        control_socket: send the unary calls over the daemon's control socket when it names one (a daemon
            on a unix socket; :mod:`.control`), else through gRPC.
    """

    timeout_s: float = 5.0
    stream_timeout_s: float = 60.0
    engine_id: str = ""
    backoff: BackoffConfig = field(default_factory=BackoffConfig)
    channel: ChannelConfig = field(default_factory=ChannelConfig)
    control_socket: bool = True

    def __post_init__(self) -> None:
        for name in ("timeout_s", "stream_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise InvalidArgumentError(name, f"must be > 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class EngineModels:
    """The engine's cost models for one namespace, sent with its registration.

    Attributes:
        prefill: the prefill model (needed for cost-aware loads).
        deadline: the load-deadline model (timeout loads without an explicit timeout).
    """

    prefill: PrefillModel | None
    deadline: DeadlineModel | None


class Connection:
    """One daemon's channel, stub, backoff state and handle cache. Thread-safe.

    Attributes:
        endpoint: the daemon's address.
        config: deadlines, backoff and channel options.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        token: str | None,
        config: ClientConfig,
        on_registered: Callable[[frozenset[str]], None] | None = None,
    ) -> None:
        """Prepare a connection; nothing is dialled until the first call.

        Args:
            endpoint: the daemon's address.
            token: bearer token when the daemon has a tokens file.
            config: deadlines, backoff and channel options.
            on_registered: told, after every registration, the shared-memory segments the current
                registrations name (so that mappings of segments no longer named can be dropped).

        Raises:
            InvalidArgumentError: a malformed token.
        """
        self.endpoint = endpoint
        self.config = config
        self._metadata: Metadata = auth_metadata(token)
        self._token = token
        self._control: ControlSocket | None = None
        self._on_registered = on_registered
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._stub: KVCacheServiceStub | None = None
        self._generation = 0
        self._backoff = Backoff(config.backoff)
        self._registrations: dict[Namespace, Registration] = {}
        self._models: dict[Namespace, EngineModels] = {}
        self._stale: set[Namespace] = set()
        self._closed = False
        self._one_way: set[grpc.Future] = set()  # unary_nowait calls not answered yet

    def close(self) -> None:
        """Close the channel (idempotent); later calls fail with UnavailableError.

        One-way calls still in flight (:meth:`unary_nowait`: lease releases, usage reports) are waited for
        first, at most ``config.timeout_s`` in all: closing a gRPC channel cancels its calls, and a usage
        report sent just before an engine exits would be lost.
        """
        with self._lock:
            self._closed = True
            in_flight = list(self._one_way)
        _wait_all(in_flight, self.config.timeout_s)
        with self._lock:
            channel, self._channel, self._stub = self._channel, None, None
            control, self._control = self._control, None
        if channel is not None:
            channel.close()
        if control is not None:
            control.close()

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait (without polling) until the channel is connected; False after ``timeout_s``.

        One diagnostics echo that waits for the connection (``wait_for_ready``): any answer, even an error
        status, comes from a connected daemon. (``grpc.channel_ready_future`` leaves a connectivity-polling
        thread behind that fails with "Channel closed!" when the channel is closed soon after.)
        """
        self._stub_or_fail("wait_ready", ignore_backoff=True)
        with self._lock:
            channel = self._channel
        if channel is None:
            return False
        try:
            DiagnosticsStub(channel).Echo(
                pb.EchoMessage(), timeout=timeout_s, metadata=self._metadata, wait_for_ready=True
            )
        except grpc.RpcError as exc:
            return exc.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)
        except ValueError:  # the channel was closed meanwhile
            return False
        return True

    # ------------------------------------------------------------------ handle cache

    def declare_models(self, namespace: Namespace, models: EngineModels) -> None:
        """Declare the engine's cost models for ``namespace`` (sent with the next registration)."""
        with self._lock:
            if self._models.get(namespace) == models:
                return
            self._models[namespace] = models
            if namespace in self._registrations:
                self._stale.add(namespace)  # register again with the new models

    def models(self, namespace: Namespace) -> EngineModels | None:
        """The cost models declared for ``namespace``, if any."""
        with self._lock:
            return self._models.get(namespace)

    def register(self, namespace: Namespace) -> Registration:
        """Register ``namespace`` (again) now and return what the daemon accepted."""
        stub, generation = self._stub_or_fail(REGISTER.name)
        return self._register(namespace, stub, generation)

    def registration(self, namespace: Namespace) -> Registration:
        """The current registration of ``namespace``, registering it first when needed."""
        stub, generation = self._stub_or_fail(REGISTER.name)
        return self._current(namespace, stub, generation)

    # ------------------------------------------------------------------ calls

    def unary(
        self,
        rpc: UnaryRpc[Req, Resp],
        namespace: Namespace | None,
        build: Callable[[bytes], Req],
        timeout_s: float | None = None,
        retry: bool = True,
    ) -> Resp:
        """Call a unary RPC with the request ``build(handle)`` (the handle is b"" without a namespace).

        Args:
            rpc: the RPC.
            namespace: the namespace whose handle the request carries (None: no handle).
            build: the request for a handle.
            timeout_s: the call's deadline (None: ``config.timeout_s``).
            retry: retry once after a lost handle (only for calls that are safe to repeat).
        """
        return self.unary_registered(
            rpc, namespace, lambda reg: build(reg.handle if reg is not None else b""), timeout_s, retry
        )

    def unary_registered(
        self,
        rpc: UnaryRpc[Req, Resp],
        namespace: Namespace | None,
        build: Callable[[Registration | None], Req],
        timeout_s: float | None = None,
        retry: bool = True,
    ) -> Resp:
        """Like :meth:`unary`, with the request built from the namespace's current registration (None without
        a namespace): for a request whose form depends on what the daemon said it reads. A retry after
        re-registration builds it again from the new registration (the daemon may have changed)."""
        deadline = timeout_s if timeout_s is not None else self.config.timeout_s

        def run(stub: KVCacheServiceStub, reg: Registration | None) -> Resp:
            control = self._control
            if control is not None:
                try:
                    return control.call(rpc, build(reg), deadline)
                except ControlUnreachable as exc:
                    self._drop_control(control, exc)
            return rpc.invoke(stub, build(reg), deadline, self._metadata)

        return self._call(rpc.name, namespace, run, retry)

    def unary_nowait(
        self, rpc: UnaryRpc[Req, Resp], namespace: Namespace, build: Callable[[bytes], Req]
    ) -> None:
        """Send one unary call and return at once; its failure is only logged.

        The connection state is left to the next waited call: the callback runs on a gRPC thread, which
        must not close the channel it belongs to.
        """
        try:
            stub, generation = self._stub_or_fail(rpc.name)
            handle = self._current(namespace, stub, generation).handle
        except TierCacheError as exc:
            logger.info("%s not sent (%s)", rpc.name, exc)
            return
        call = rpc.future(stub, build(handle), self.config.timeout_s, self._metadata)
        with self._lock:
            self._one_way.add(call)

        def done(fut: grpc.Future) -> None:
            with self._lock:
                self._one_way.discard(fut)
            if fut.cancelled():
                return
            exc = fut.exception()
            if isinstance(exc, grpc.RpcError):
                logger.info("%s failed (%s)", rpc.name, error_from_rpc(exc, rpc.name))

        call.add_done_callback(done)

    def client_stream(
        self,
        rpc: StreamUnaryRpc[Req, Resp],
        namespace: Namespace,
        requests: Callable[[bytes], Iterator[Req | Framed[Req]]],
    ) -> Resp:
        """Send the request stream ``requests(handle)`` under ``config.stream_timeout_s``; never retried.

        An exception raised by the request iterator itself (the engine's payloads) is re-raised as is, not
        as the CANCELLED status gRPC turns it into. gRPC pulls the requests on its own daemon thread: when
        this returns or raises, that thread is out of them for good and they are closed (:mod:`.feed`).
        """

        def run(stub: KVCacheServiceStub, reg: Registration | None) -> Resp:
            feed = RequestFeed(requests(reg.handle if reg is not None else b""))
            try:
                return rpc.invoke(stub, feed, self.config.stream_timeout_s, self._metadata)
            except grpc.RpcError:
                if feed.failure is not None:
                    raise feed.failure from None
                raise
            finally:
                feed.shut()

        return self._call(rpc.name, namespace, run, retry=False)

    def server_stream(
        self,
        rpc: UnaryStreamRpc[Req, Resp],
        namespace: Namespace,
        build: Callable[[bytes], Req],
        read: Callable[[Iterator[Framed[Resp]]], T],
    ) -> T:
        """Call a server-streaming RPC and hand its messages to ``read`` under ``config.stream_timeout_s``.

        When ``read`` raises (a malformed stream, or the consumer failed) the call is cancelled at once, so
        that the daemon releases what it holds for it. A lost handle is retried once, with a fresh ``read``
        over the new stream.
        """

        def run(stub: KVCacheServiceStub, reg: Registration | None) -> T:
            call = rpc.invoke(
                stub,
                build(reg.handle if reg is not None else b""),
                self.config.stream_timeout_s,
                self._metadata,
            )
            try:
                return read(iter(call))
            except BaseException:
                call.cancel()
                raise

        return self._call(rpc.name, namespace, run)

    # ------------------------------------------------------------------ internals

    def _call(
        self,
        method: str,
        namespace: Namespace | None,
        run: Callable[[KVCacheServiceStub, Registration | None], T],
        retry: bool = True,
    ) -> T:
        """Run one RPC with the current stub and registration; map failures; retry once after a lost handle."""
        attempts = 2 if retry and namespace is not None else 1
        for attempt in range(attempts):
            stub, generation = self._stub_or_fail(method)
            reg = self._current(namespace, stub, generation) if namespace is not None else None
            try:
                result = run(stub, reg)
            except grpc.RpcError as exc:
                error = self._failed(exc, method, generation, namespace)
                if attempt + 1 < attempts and is_lost_handle(error):
                    logger.info("%s: daemon lost the handle (restarted?); registering again", method)
                    continue
                raise error from None
            self._succeeded()
            return result
        raise AssertionError("unreachable")  # pragma: no cover

    def _stub_or_fail(self, method: str, ignore_backoff: bool = False) -> tuple[KVCacheServiceStub, int]:
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
                self._stub = ServiceStub(self._channel)
                self._generation += 1
                self._stale.update(self._registrations)
            return self._stub, self._generation

    def _current(self, namespace: Namespace, stub: KVCacheServiceStub, generation: int) -> Registration:
        """The namespace's registration, registering it (again) first when it has none or a stale one."""
        with self._lock:
            reg = self._registrations.get(namespace)
            if reg is not None and namespace not in self._stale:
                return reg
        return self._register(namespace, stub, generation)

    def _register(self, namespace: Namespace, stub: KVCacheServiceStub, generation: int) -> Registration:
        with self._lock:
            models = self._models.get(namespace)
        request = pb.RegisterRequest(namespace=namespace_to_proto(namespace), engine_id=self.config.engine_id)
        if models is not None and models.prefill is not None:
            request.prefill.CopyFrom(prefill_to_proto(models.prefill))
        if models is not None and models.deadline is not None:
            request.deadline.CopyFrom(deadline_to_proto(models.deadline))
        try:
            resp = REGISTER.invoke(stub, request, self.config.timeout_s, self._metadata)
        except grpc.RpcError as exc:
            raise self._failed(exc, REGISTER.name, generation, None) from None
        reg = Registration.from_proto(resp)
        if reg.layout != namespace.layout or reg.chunk_bytes != namespace.layout.chunk_bytes:
            raise InvalidArgumentError(
                "layout",
                f"the daemon accepted {reg.layout} ({reg.chunk_bytes} bytes per chunk), the namespace has"
                f" {namespace.layout} ({namespace.layout.chunk_bytes})",
            )
        control = reg.control_socket if self.config.control_socket and self.endpoint.is_unix else ""
        with self._lock:
            again = namespace in self._registrations
            self._registrations[namespace] = reg
            self._stale.discard(namespace)
            in_use = frozenset(r.segment.shm_segment for r in self._registrations.values() if r.segment)
            old = self._control
            if old is None or old.path != control:
                self._control = ControlSocket(control, self._token) if control else None
            else:
                old = None
        if old is not None:
            old.close()
        if self._on_registered is not None:
            self._on_registered(in_use)
        logger.info(
            "%s namespace %s (handle %s, segment %s)",
            "re-registered" if again else "registered",
            namespace.model_id,
            reg.handle.hex()[:16],
            reg.segment.shm_segment if reg.segment else None,
        )
        self._succeeded()
        return reg

    def _failed(
        self, exc: grpc.RpcError, method: str, generation: int, namespace: Namespace | None
    ) -> TierCacheError:
        """Map a failed call to its typed error and update the connection state."""
        error = error_from_rpc(exc, method)
        dropped: grpc.Channel | None = None
        control: ControlSocket | None = None
        with self._lock:
            if (
                isinstance(error, (UnavailableError, DeadlineExceededError))
                and generation == self._generation
            ):
                delay = self._backoff.failed()
                if isinstance(error, UnavailableError):
                    # Drop the channel: the next attempt dials afresh (the daemon may be a new process).
                    dropped, self._channel, self._stub = self._channel, None, None
                    control, self._control = self._control, None
                    self._stale.update(self._registrations)
                logger.warning("%s failed (%s); next attempt in %.2fs", method, error, delay)
            elif namespace is not None and is_lost_handle(error):
                self._stale.add(namespace)
        if dropped is not None:
            dropped.close()
        if control is not None:
            control.close()
        return error

    def _drop_control(self, control: ControlSocket, why: ControlUnreachable) -> None:
        """Send calls through gRPC from now on (until the next registration names a control socket)."""
        with self._lock:
            if self._control is control:
                self._control = None
        control.close()
        logger.warning("%s; calls go through gRPC", why.details())

    def _succeeded(self) -> None:
        with self._lock:
            self._backoff.succeeded()


def _wait_all(calls: list[grpc.Future], timeout_s: float) -> None:
    """Wait until every call is answered (or failed), at most ``timeout_s`` in all."""
    deadline = time.monotonic() + timeout_s
    for call in calls:  # a failure is logged by the call's callback; a late call is cancelled by the close
        with contextlib.suppress(grpc.RpcError, grpc.FutureTimeoutError, grpc.FutureCancelledError):
            call.result(timeout=max(0.0, deadline - time.monotonic()))
