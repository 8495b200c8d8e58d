"""Prometheus metrics of the daemon, in a registry of its own (never the global one).

Cache-wide figures (tier usage, hits, misses, evictions, promotions, demotions, corrupt reads, token-weighted
lookup / load / effective hits, fallback-recompute tokens, measured tier rates, leases, write-downs,
single-flight prefill claims, waits and take-overs) are read from one :meth:`CacheManager.stats` snapshot at
scrape time. The servicer records
what only it sees: RPC latency per method and status code, and bytes moved per data path and direction.

Primitives:
    DaemonMetrics: the registry, ``observe_rpc``, ``add_bytes``, ``serve`` / ``stop`` of the HTTP endpoint.
    StatsCollector: the scrape-time collector over a stats snapshot function.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tiercache.stats import CacheStats

from .config import MetricsConfig

logger = logging.getLogger(__name__)

LATENCY_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
"""Histogram buckets of RPC latency, seconds."""


class StatsCollector(Collector):
    """Turns one cache stats snapshot into metric families at each scrape."""

    def __init__(self, snapshot: Callable[[], CacheStats]) -> None:
        """Args: snapshot: returns the current stats (thread-safe; called on the HTTP server's thread)."""
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        """The metric families of the current snapshot."""
        stats = self._snapshot()
        gauges = {
            "chunks": GaugeMetricFamily("tiercache_tier_chunks", "Chunks held by a tier", labels=["tier"]),
            "used_bytes": GaugeMetricFamily(
                "tiercache_tier_used_bytes", "Bytes used in a tier", labels=["tier"]
            ),
            "capacity_bytes": GaugeMetricFamily(
                "tiercache_tier_capacity_bytes", "Capacity of a tier", labels=["tier"]
            ),
        }
        counters = {
            "hits": CounterMetricFamily(
                "tiercache_tier_hits", "Chunk reads served by a tier", labels=["tier"]
            ),
            "misses": CounterMetricFamily(
                "tiercache_tier_misses", "Chunk reads that missed in a tier", labels=["tier"]
            ),
            "evictions": CounterMetricFamily(
                "tiercache_tier_evictions", "Chunks evicted from a tier for room", labels=["tier"]
            ),
            "promotions": CounterMetricFamily(
                "tiercache_tier_promotions", "Chunks copied into a tier from a slower one", labels=["tier"]
            ),
            "demotions": CounterMetricFamily(
                "tiercache_tier_demotions", "Chunks copied into a tier from a faster one", labels=["tier"]
            ),
            "corrupt_reads": CounterMetricFamily(
                "tiercache_tier_corrupt_reads", "Values that failed their checksum", labels=["tier"]
            ),
            "lookup_hit_tokens": CounterMetricFamily(
                "tiercache_lookup_hit_tokens",
                "Tokens of engine lookups' cached prefixes, by the fastest tier holding them",
                labels=["tier"],
            ),
            "load_success_tokens": CounterMetricFamily(
                "tiercache_load_success_tokens", "Tokens loaded into engines, by source tier", labels=["tier"]
            ),
            "effective_hit_tokens": CounterMetricFamily(
                "tiercache_effective_hit_tokens",
                "Prefill tokens engines reported skipped, by source tier",
                labels=["tier"],
            ),
        }
        gauges["latency_s"] = GaugeMetricFamily(
            "tiercache_tier_read_latency_seconds",
            "Measured fixed cost of a read from a tier",
            labels=["tier"],
        )
        gauges["bytes_per_s"] = GaugeMetricFamily(
            "tiercache_tier_read_bytes_per_second", "Measured read bandwidth of a tier", labels=["tier"]
        )
        for tier in stats.tiers:
            label = [tier.level.name]
            for name, gauge in gauges.items():
                gauge.add_metric(label, getattr(tier, name))
            for name, counter in counters.items():
                counter.add_metric(label, getattr(tier, name))
        yield from gauges.values()
        yield from counters.values()
        yield GaugeMetricFamily("tiercache_namespaces", "Registered namespaces", value=stats.namespaces)
        yield GaugeMetricFamily("tiercache_active_leases", "Load leases held now", value=stats.active_leases)
        yield CounterMetricFamily(
            "tiercache_expired_leases",
            "Leases and store tickets reclaimed at their TTL",
            value=stats.expired_leases,
        )
        yield CounterMetricFamily(
            "tiercache_single_flight_joins",
            "Reads that joined one in flight",
            value=stats.single_flight_joins,
        )
        yield GaugeMetricFamily(
            "tiercache_pending_writes", "Write-downs queued or running", value=stats.pending_writes
        )
        yield CounterMetricFamily(
            "tiercache_failed_writes", "Write-downs that found no room", value=stats.failed_writes
        )
        yield CounterMetricFamily(
            "tiercache_recomputed_tokens",
            "Prefill tokens engines reported recomputing although they had looked them up",
            value=stats.recomputed_tokens,
        )
        yield from _prefill_families(stats)


def _prefill_families(stats: CacheStats) -> Iterator[Metric]:
    """The single-flight prefill gauges and counters."""
    prefill = stats.prefill
    yield GaugeMetricFamily(
        "tiercache_prefill_active_claims",
        "Single-flight prefill claims leading at least one unpublished chunk",
        value=prefill.active_claims,
    )
    yield GaugeMetricFamily(
        "tiercache_prefill_claimed_chunks",
        "Chunks being computed under a single-flight prefill claim",
        value=prefill.claimed_chunks,
    )
    yield CounterMetricFamily(
        "tiercache_prefill_waits",
        "Prefill waits that found another request computing a chunk they needed",
        value=prefill.waits,
    )
    yield CounterMetricFamily(
        "tiercache_prefill_takeovers",
        "Chunks claimed after their previous leader gave them up or died",
        value=prefill.takeovers,
    )
    yield CounterMetricFamily(
        "tiercache_prefill_expired_claims",
        "Prefill claims that lapsed at their TTL (their leader died)",
        value=prefill.expired_claims,
    )


class DaemonMetrics:
    """The daemon's metrics and their optional HTTP endpoint."""

    def __init__(self, snapshot: Callable[[], CacheStats]) -> None:
        """Create the registry and the metrics.

        Args:
            snapshot: the cache manager's ``stats``.
        """
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(StatsCollector(snapshot))
        self._rpc_seconds = Histogram(
            "tiercache_rpc_duration_seconds",
            "Latency of RPCs by method and status code",
            ["method", "code"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self._bytes = Counter(
            "tiercache_bytes_moved",
            "Chunk bytes moved by engines: path shm (shared memory) or stream, direction store or load",
            ["path", "direction"],
            registry=self.registry,
        )
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def observe_rpc(self, method: str, code: str, seconds: float) -> None:
        """Record one finished RPC."""
        self._rpc_seconds.labels(method, code).observe(seconds)

    def add_bytes(self, path: str, direction: str, nbytes: int) -> None:
        """Count chunk bytes moved (``path``: shm or stream; ``direction``: store or load)."""
        if nbytes > 0:
            self._bytes.labels(path, direction).inc(nbytes)

    def serve(self, config: MetricsConfig) -> int:
        """Start ``/metrics`` on a background thread when ``config.port`` is set; returns the bound port or 0.

        Raises:
            OSError: the address is taken or cannot be bound.
        """
        if config.port == 0:
            return 0
        self._server, self._thread = start_http_server(config.port, config.host, registry=self.registry)
        port = int(self._server.server_port)
        logger.info("metrics on http://%s:%d/metrics", config.host, port)
        return port

    def stop(self) -> None:
        """Stop the HTTP endpoint (idempotent)."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join()
