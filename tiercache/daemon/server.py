"""The daemon process: tiers and cache manager from the config, the grpc.aio server, and a clean shutdown.

Start: check the socket path (a live daemon there is an error, a stale file is removed), build the tiers (L1
when configured, L2 always, L3 unless disabled; a warm L3 is re-indexed) and the cache manager in the
executor, freeze the start-up objects out of the garbage collector's passes
(:func:`~tiercache.gcpause.settle_started`: each full pass walked ~200,000 of them, a ~100 ms stall of
whichever call it hit), register the servicers (through :mod:`.decode`: an undecodable request answers
INVALID_ARGUMENT; Diagnostics only with ``--diagnostics``), start ``/metrics`` when configured (the operator's
token required unless ``--metrics-public``), bind the unix socket (in a directory that is the
daemon's own, with its mode from the bind: :mod:`.listen`) and/or TCP (TLS when
configured: :mod:`.tls`), serve the unary calls on the control socket ``<socket>.ctl`` too (:mod:`.control`,
unless turned off), mark the health service SERVING and log ``tiercache-daemon listening on ...``.

Stop (SIGTERM or SIGINT): health NOT_SERVING, event streams ended, ``server.stop(grace)`` and the control
socket refuse new calls and wait for in-flight ones, the executor finishes its work, the manager finishes its
queued write-downs (and those the watermark policy deferred, for at most ``stop_write_down_s``) and closes
the tiers (the L2 segment is unlinked, L3 is closed and kept), ``/metrics`` stops, the socket files are
removed.

Primitives:
    build_daemon_cache: the tiers and the cache manager of a config (through ``tiercache.cache.build_cache``).
    Daemon: ``run()`` until a signal or ``stop()``; returns the exit code.
    DRAIN_GRACE_S, HEALTH_SERVICES.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from tiercache.cache import CacheBuildConfig, CacheConfig, CacheManager, build_cache
from tiercache.cache.quotas import QuotaTable
from tiercache.gcpause import settle_started
from tiercache.proto import tiercache_pb2 as pb
from tiercache.stats import CacheStats
from tiercache.tiers.base import TierLevel
from tiercache.tiers.host import HostTier

from .auth import Authenticator
from .config import DaemonConfig, TierConfigs
from .control import ControlServer
from .decode import add_servicer
from .diagnostics import DiagnosticsServicer
from .events import EventHub
from .fairness import Holdings, TenantWaits
from .fdserver import TenantPools
from .handles import HandleRegistry
from .limits import RateLimiter
from .listen import SocketFile, StartupError, prepare_socket_path, socket_umask
from .metrics import DaemonMetrics
from .rpc import DataPlaneInfo, ServiceDeps
from .servicer import KVCacheServicer
from .tls import server_credentials

logger = logging.getLogger(__name__)

DRAIN_GRACE_S = 10.0
"""How long in-flight calls may take to finish once a stop is requested."""
HEALTH_SERVICES = ("", "tiercache.v1.KVCacheService", "tiercache.v1.Diagnostics")
"""Services reported by the gRPC health service (Diagnostics only when served: ``--diagnostics``)."""


def build_daemon_cache(tiers: TierConfigs, cache: CacheConfig) -> tuple[CacheManager, HostTier]:
    """Build the tiers and a cache manager over them (blocking: L2 is pre-faulted, L3 re-indexed).

    Returns:
        The manager (it owns the tiers) and the L2 tier (whose segment engines map).

    Raises:
        InvalidArgumentError, OSError: a tier could not be built (those built are closed again).
    """
    manager = build_cache(
        CacheBuildConfig(cache=cache, l1=tiers.l1, l2=tiers.l2, l3=tiers.l3, shared=tiers.shared)
    )
    host = manager.tier(TierLevel.L2)
    assert isinstance(host, HostTier)
    return manager, host


class Daemon:
    """One daemon: serves until SIGTERM/SIGINT (or :meth:`stop`), then drains and cleans up."""

    def __init__(
        self,
        config: DaemonConfig,
        tokens: Mapping[bytes, str] | None,
        quotas: QuotaTable | None = None,
        operator: bytes | None = None,
    ) -> None:
        """Args: config: the validated configuration; tokens: from the tokens file, None for no auth;
        quotas: the tenants' quotas from the same file (None: none); operator: the digest of the operator's
        token (None: none)."""
        self._config = config
        self._quotas = quotas or QuotaTable()
        self._limiter = RateLimiter(self._quotas) if self._quotas.active else None
        self._auth = Authenticator(tokens, self._limiter, operator)
        self._stop: asyncio.Event | None = None

    def stop(self) -> None:
        """Ask a running daemon to drain and exit (call on its event loop)."""
        if self._stop is not None:
            self._stop.set()

    def _on_signal(self, signum: int) -> None:
        if self._stop is not None and self._stop.is_set():
            logger.warning("%s again: already draining", signal.Signals(signum).name)
            return
        logger.info("%s: draining", signal.Signals(signum).name)
        self.stop()

    async def run(self) -> int:
        """Start, serve until asked to stop, drain, clean up.

        Returns:
            0 after a clean shutdown.

        Raises:
            StartupError: the socket is in use or a listener cannot be bound.
            InvalidArgumentError, OSError: the tiers could not be built.
        """
        loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._on_signal, signum)
        if self._config.listen.socket:
            prepare_socket_path(self._config.listen.socket)
        executor = ThreadPoolExecutor(
            max_workers=min(32, (os.cpu_count() or 1) + 4), thread_name_prefix="tiercache-rpc"
        )
        waits = TenantWaits(self._config.fairness)  # a capped pool of wait threads per tenant
        manager: CacheManager | None = None
        try:
            built, host = await loop.run_in_executor(
                executor, build_daemon_cache, self._config.tiers, self._config.cache
            )
            manager = built
            logger.debug("froze %d start-up objects out of the collector's passes", settle_started())
            await self._serve(loop, manager, host, executor, waits)
        finally:
            await asyncio.to_thread(waits.shutdown, True, cancel_futures=True)
            await asyncio.to_thread(executor.shutdown, True, cancel_futures=True)
            if manager is not None:
                await asyncio.to_thread(manager.close)
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
            logger.info("tiercache-daemon stopped")
        return 0

    async def _serve(
        self,
        loop: asyncio.AbstractEventLoop,
        manager: CacheManager,
        host: HostTier,
        executor: ThreadPoolExecutor,
        waits: TenantWaits,
    ) -> None:
        assert self._stop is not None
        cfg = self._config
        handles = HandleRegistry(cfg.fairness)
        hub = EventHub(loop, scope=handles.owner if self._auth.enabled else None)  # a stream per tenant
        detach = hub.attach(manager)
        manager.set_quotas(self._quotas)
        metrics = DaemonMetrics(
            manager.stats, self._tenant_snapshots(manager) if self._auth.enabled else None
        )
        pools = self._pools(host)
        deps = ServiceDeps(
            manager=manager,
            executor=executor,
            auth=self._auth,
            handles=handles,
            events=hub,
            metrics=metrics,
            data_plane=DataPlaneInfo(
                host.segment_name,
                host.slot_bytes,
                host.num_slots,
                pools,
                host.max_chunk_bytes,
                host.segment_bytes,
                host.index_entries,
            ),
            stream=cfg.stream,
            lease_ttl_s=cfg.cache.lease_ttl_s,
            wait_executor=waits,
            holdings=Holdings(cfg.fairness),
            max_ttl_s=cfg.cache.max_ttl_s,
            control_socket=self._control_path(),
            quotas_active=self._quotas.active,
        )
        limit = cfg.stream.max_message_bytes
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", limit),
                ("grpc.so_reuseport", 0),
            ]
        )
        services = pb.DESCRIPTOR.services_by_name
        handlers = add_servicer(server, KVCacheServicer(deps), services["KVCacheService"])
        if cfg.listen.diagnostics:
            handlers |= add_servicer(server, DiagnosticsServicer(deps), services["Diagnostics"])
        control = (
            ControlServer(handlers, deps.control_socket, cfg.listen.socket_mode, limit, self._auth)
            if deps.control_socket
            else None
        )
        health = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        socket_file: SocketFile | None = None
        try:
            metrics.serve(cfg.metrics, None if cfg.metrics.public else self._auth.is_operator_header)
            addresses, socket_file = self._bind(server)
            await server.start()
            if pools is not None:
                pools.start()
            if control is not None:
                await control.start()
            for service in HEALTH_SERVICES if cfg.listen.diagnostics else HEALTH_SERVICES[:2]:
                await health.set(service, health_pb2.HealthCheckResponse.SERVING)
            logger.info("tiercache-daemon listening on %s", " and ".join(addresses))
            await self._stop.wait()
            await health.enter_graceful_shutdown()
            hub.close()
        finally:
            await asyncio.gather(
                server.stop(DRAIN_GRACE_S), control.close(DRAIN_GRACE_S) if control else asyncio.sleep(0)
            )
            if pools is not None:
                pools.close()
            hub.close()
            detach()
            await asyncio.to_thread(metrics.stop)
            if socket_file is not None:
                socket_file.remove()

    def _tenant_snapshots(
        self, manager: CacheManager
    ) -> Callable[[], tuple[Mapping[str, CacheStats], Mapping[str, int]]]:
        """Every tenant's own stats and RPC-rate refusals, for ``/metrics``."""
        limiter = self._limiter

        def snapshot() -> tuple[Mapping[str, CacheStats], Mapping[str, int]]:
            refused = limiter.refusals if limiter is not None else {}
            return {t: manager.stats(t) for t in manager.tenants()}, refused

        return snapshot

    def _control_path(self) -> str:
        """The control socket's path: ``<socket>.ctl`` with a unix listener and the option on, else ""."""
        listen = self._config.listen
        return listen.socket + ".ctl" if listen.socket and listen.control_socket else ""

    def _pools(self, host: HostTier) -> TenantPools | None:
        """The isolated data plane (tenant pools by file descriptor): with tokens and a unix socket."""
        listen = self._config.listen
        if not self._auth.enabled or not listen.socket:
            return None
        return TenantPools(host, self._auth, listen.socket + ".fd", listen.socket_mode)

    def _bind(self, server: grpc.aio.Server) -> tuple[list[str], SocketFile | None]:
        """Add the configured listeners; returns their addresses and the unix socket file."""
        listen = self._config.listen
        addresses: list[str] = []
        socket_file = None
        if listen.socket:
            try:
                with socket_umask(listen.socket_mode):
                    server.add_insecure_port("unix:" + listen.socket)
            except RuntimeError as exc:
                raise StartupError(f"--socket: cannot listen on {listen.socket}: {exc}") from None
            socket_file = SocketFile.bound(listen.socket, listen.socket_mode)
            addresses.append("unix:" + listen.socket)
        if listen.tcp:
            try:
                if listen.tls.enabled:
                    port = server.add_secure_port(listen.tcp, server_credentials(listen.tls))
                else:
                    port = server.add_insecure_port(listen.tcp)
            except RuntimeError as exc:
                raise StartupError(f"--tcp: cannot listen on {listen.tcp}: {exc}") from None
            host = listen.tcp.rpartition(":")[0]
            scheme = ("mtls" if listen.tls.mutual else "tls") if listen.tls.enabled else "tcp"
            addresses.append(f"{scheme}:{host}:{port}")
        return addresses, socket_file
