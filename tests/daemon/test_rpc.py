"""The RPC decorators: no handler runs for an unauthenticated call or with a handle that is not its caller's;
errors become statuses; every RPC but the echo baselines is recorded in the metrics. And every RPC of both
services has a handler (the generated UNIMPLEMENTED stubs never answer).

The decorated handlers are called the way grpc.aio calls them, with a stand-in of the two methods of
``grpc.aio.ServicerContext`` the decorators use; everything else (tokens, handles, cache, metrics) is real.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.daemon.conftest import LAYOUT, NAMESPACE, SLOT_BYTES, TENANT_A, TENANT_B, write_tokens
from tiercache.cache import CacheManager
from tiercache.daemon.auth import Authenticator, load_tokens
from tiercache.daemon.config import StreamConfig
from tiercache.daemon.diagnostics import DiagnosticsServicer
from tiercache.daemon.events import EventHub
from tiercache.daemon.handles import HandleRegistry
from tiercache.daemon.metrics import DaemonMetrics
from tiercache.daemon.rpc import (
    Caller,
    DataPlaneInfo,
    ServiceDeps,
    ServicerBase,
    server_stream,
    server_stream_tenant,
    unary,
    unary_tenant,
)
from tiercache.daemon.servicer import KVCacheServicer
from tiercache.errors import ConflictError
from tiercache.proto import tiercache_pb2 as pb
from tiercache.proto import tiercache_pb2_grpc as pb_grpc
from tiercache.tiers.host import HostTier, HostTierConfig


class Context:
    """What the decorators use of a ``grpc.aio.ServicerContext``: the call's metadata, and abort."""

    def __init__(self, metadata: Sequence[tuple[str, str]]) -> None:
        self._metadata = tuple(metadata)
        self.status: tuple[grpc.StatusCode, str] | None = None

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.status = (code, details)
        raise grpc.aio.AbortError()


class Probe(ServicerBase):
    """Handlers that only record what they were given (or raise what they are told to)."""

    def __init__(self, deps: ServiceDeps) -> None:
        super().__init__(deps)
        self.seen: list[object] = []
        self.raise_: Exception | None = None

    def _enter(self, who: object) -> None:
        self.seen.append(who)
        if self.raise_ is not None:
            raise self.raise_

    @unary
    async def ByHandle(self, request: pb.PurgeRequest, caller: Caller, context: Any) -> str:
        self._enter(caller)
        return "done"

    @unary_tenant
    async def ByTenant(self, request: pb.StatsRequest, tenant: str, context: Any) -> str:
        self._enter(tenant)
        return "done"

    @server_stream
    async def StreamByHandle(
        self, request: pb.PurgeRequest, caller: Caller, context: Any
    ) -> AsyncIterator[str]:
        self._enter(caller)
        yield "one"
        yield "two"

    @server_stream_tenant
    async def StreamByTenant(self, request: pb.StatsRequest, tenant: str, context: Any) -> AsyncIterator[str]:
        self._enter(tenant)
        yield "one"


@pytest.fixture
def deps(tmp_path: Path) -> Iterator[ServiceDeps]:
    host = HostTier(
        HostTierConfig(capacity_bytes=4 * SLOT_BYTES, slot_bytes=SLOT_BYTES, segment_prefix="tiercache-test")
    )
    manager = CacheManager([host])
    executor = ThreadPoolExecutor(max_workers=2)
    loop = asyncio.new_event_loop()  # the hub's loop: no test here publishes events
    try:
        yield ServiceDeps(
            manager=manager,
            executor=executor,
            auth=Authenticator(load_tokens(str(write_tokens(tmp_path / "tokens.toml")))),
            handles=HandleRegistry(),
            events=EventHub(loop),
            metrics=DaemonMetrics(manager.stats),
            data_plane=DataPlaneInfo(host.segment_name, host.slot_bytes, host.num_slots),
            stream=StreamConfig(max_message_bytes=1 << 20, stream_chunk_bytes=64 << 10),
            lease_ttl_s=30.0,
        )
    finally:
        loop.close()
        executor.shutdown()
        manager.close()


def registered(deps: ServiceDeps, tenant: str) -> bytes:
    handle = deps.manager.register_namespace(NAMESPACE, tenant)
    deps.handles.add(handle, tenant, LAYOUT.chunk_bytes, LAYOUT.chunk_tokens)
    return handle


def recorded(deps: ServiceDeps, method: str, code: str) -> float | None:
    return deps.metrics.registry.get_sample_value(
        "tiercache_rpc_duration_seconds_count", {"method": method, "code": code}
    )


async def refused(call: Any, context: Context) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AbortError):
        await call
    assert context.status is not None
    return context.status


async def drain(stream: AsyncIterator[str]) -> list[str]:
    return [item async for item in stream]


BAD_TOKENS = ((), (("authorization", "Bearer nope"),), (("authorization", "Basic abc"),))


@pytest.mark.parametrize("metadata", BAD_TOKENS)
async def test_no_handler_runs_for_an_unauthenticated_call(
    deps: ServiceDeps, metadata: tuple[tuple[str, str], ...]
) -> None:
    probe = Probe(deps)
    handle = registered(deps, "team-a")  # a valid handle: only the token is wrong
    calls = (
        lambda ctx: probe.ByHandle(pb.PurgeRequest(handle=handle), ctx),
        lambda ctx: probe.ByTenant(pb.StatsRequest(), ctx),
        lambda ctx: drain(probe.StreamByHandle(pb.PurgeRequest(handle=handle), ctx)),
        lambda ctx: drain(probe.StreamByTenant(pb.StatsRequest(), ctx)),
    )
    for call in calls:
        context = Context(metadata)
        code, details = await refused(call(context), context)
        assert code == grpc.StatusCode.UNAUTHENTICATED and details.startswith("authorization: ")
    assert probe.seen == []
    for method in ("ByHandle", "ByTenant", "StreamByHandle", "StreamByTenant"):
        assert recorded(deps, method, "UNAUTHENTICATED") == 1


@pytest.mark.parametrize(
    ("handle_of", "code"),
    [
        (lambda own, other: b"abc", grpc.StatusCode.INVALID_ARGUMENT),
        (lambda own, other: b"\x01" * 16, grpc.StatusCode.NOT_FOUND),
        (lambda own, other: other, grpc.StatusCode.NOT_FOUND),
    ],
    ids=["malformed", "unknown", "foreign"],
)
async def test_no_handler_runs_with_a_handle_that_is_not_the_callers(
    deps: ServiceDeps, handle_of: Any, code: grpc.StatusCode
) -> None:
    probe = Probe(deps)
    handle = handle_of(registered(deps, "team-a"), registered(deps, "team-b"))
    for call in (
        lambda ctx: probe.ByHandle(pb.PurgeRequest(handle=handle), ctx),
        lambda ctx: drain(probe.StreamByHandle(pb.PurgeRequest(handle=handle), ctx)),
    ):
        context = Context(TENANT_A)
        got, details = await refused(call(context), context)
        assert got == code and details.startswith("handle: ")
    assert probe.seen == []
    assert recorded(deps, "ByHandle", code.name) == 1


async def test_handlers_get_the_resolved_caller_or_tenant(deps: ServiceDeps) -> None:
    probe = Probe(deps)
    handle = registered(deps, "team-b")
    assert await probe.ByHandle(pb.PurgeRequest(handle=handle), Context(TENANT_B)) == "done"
    assert await drain(probe.StreamByHandle(pb.PurgeRequest(handle=handle), Context(TENANT_B))) == [
        "one",
        "two",
    ]
    assert await probe.ByTenant(pb.StatsRequest(), Context(TENANT_B)) == "done"
    assert await drain(probe.StreamByTenant(pb.StatsRequest(), Context(TENANT_B))) == ["one"]
    caller = Caller("team-b", handle, deps.handles.check(handle, "team-b"))
    assert probe.seen == [caller, caller, "team-b", "team-b"]
    assert caller.info.chunk_bytes == LAYOUT.chunk_bytes
    assert recorded(deps, "ByHandle", "OK") == 1 and recorded(deps, "StreamByHandle", "OK") == 1


async def test_errors_become_statuses(deps: ServiceDeps) -> None:
    probe = Probe(deps)
    handle = registered(deps, "team-a")
    probe.raise_ = ConflictError("state: not now")
    context = Context(TENANT_A)
    assert await refused(probe.ByHandle(pb.PurgeRequest(handle=handle), context), context) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "state: not now",
    )
    probe.raise_ = ValueError("a bug")
    context = Context(TENANT_A)
    code, details = await refused(drain(probe.StreamByTenant(pb.StatsRequest(), context)), context)
    assert code == grpc.StatusCode.INTERNAL
    assert details == "internal error in StreamByTenant: ValueError; see the daemon log"
    assert recorded(deps, "ByHandle", "FAILED_PRECONDITION") == 1
    assert recorded(deps, "StreamByTenant", "INTERNAL") == 1


async def test_echo_is_authenticated_but_not_recorded(deps: ServiceDeps) -> None:
    diag = DiagnosticsServicer(deps)
    context = Context(())
    code, _ = await refused(diag.Echo(pb.EchoMessage(data=b"x"), context), context)
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert (await diag.Echo(pb.EchoMessage(data=b"ping"), Context(TENANT_A))).data == b"ping"
    for code_name in ("OK", "UNAUTHENTICATED"):
        assert recorded(deps, "Echo", code_name) is None


@pytest.mark.parametrize(
    ("servicer", "generated", "service"),
    [
        (KVCacheServicer, pb_grpc.KVCacheServiceServicer, "KVCacheService"),
        (DiagnosticsServicer, pb_grpc.DiagnosticsServicer, "Diagnostics"),
    ],
)
def test_every_rpc_has_a_handler(servicer: type, generated: type, service: str) -> None:
    methods = [m.name for m in pb.DESCRIPTOR.services_by_name[service].methods]
    assert methods
    unimplemented = [name for name in methods if getattr(servicer, name) is getattr(generated, name)]
    assert unimplemented == []
