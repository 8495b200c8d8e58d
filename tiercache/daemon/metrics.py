"""Prometheus metrics of the daemon, in a registry of its own (never the global one).

Cache-wide figures are read from one :meth:`CacheManager.stats` snapshot at scrape time: one family per
figure of the stats schema (:mod:`tiercache.stats`: every field with a ``StatInfo``, which gives its help
text and whether it is a gauge or a counter), named ``tiercache_<group><field>`` (groups: ``tier_`` with a
``tier`` label, none for cache-wide figures, ``prefill_``) unless the schema names it. The servicer records
what only it sees: RPC latency per method and status code, and bytes moved per data path and direction.

Primitives:
    DaemonMetrics: the registry, ``observe_rpc``, ``add_bytes``, ``serve`` / ``stop`` of the HTTP endpoint.
    Figure, figures: the exported figures of a stats dataclass, derived from its fields.
    StatsCollector: the scrape-time collector over a stats snapshot function.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tiercache.stats import CacheStats, PrefillStats, StatInfo, StatKind, TierStats, stat_info

from .config import MetricsConfig

logger = logging.getLogger(__name__)

LATENCY_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
"""Histogram buckets of RPC latency, seconds."""


_GROUPS: dict[type, str] = {TierStats: "tier_", CacheStats: "", PrefillStats: "prefill_"}
"""Metric name prefix (after ``tiercache_``) of each stats dataclass's figures."""

_FAMILIES: dict[StatKind, type[GaugeMetricFamily] | type[CounterMetricFamily]] = {
    StatKind.GAUGE: GaugeMetricFamily,
    StatKind.COUNTER: CounterMetricFamily,
}


@dataclass(frozen=True, slots=True)
class Figure:
    """One exported figure: a stats field and its metric family.

    Attributes:
        field: the field's name in its stats dataclass.
        metric: the family's name.
        info: help text and kind, from the schema.
    """

    field: str
    metric: str
    info: StatInfo

    def family(self, labels: Sequence[str] = ()) -> GaugeMetricFamily | CounterMetricFamily:
        """An empty family of this figure (per-tier figures carry a ``tier`` label)."""
        return _FAMILIES[self.info.kind](self.metric, self.info.help, labels=list(labels))


def figures(cls: type) -> tuple[Figure, ...]:
    """The exported figures of a stats dataclass: every field with a ``StatInfo``, in field order."""
    out = []
    for f in dataclasses.fields(cls):
        info = stat_info(f)
        if info is not None:
            name = info.metric if info.metric is not None else f"{_GROUPS[cls]}{f.name}"
            out.append(Figure(f.name, f"tiercache_{name}", info))
    return tuple(out)


_TIER_FIGURES = figures(TierStats)
_CACHE_FIGURES = figures(CacheStats)
_PREFILL_FIGURES = figures(PrefillStats)


class StatsCollector(Collector):
    """Turns one cache stats snapshot into metric families at each scrape (one per figure of the schema)."""

    def __init__(self, snapshot: Callable[[], CacheStats]) -> None:
        """Args: snapshot: returns the current stats (thread-safe; called on the HTTP server's thread)."""
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        """The metric families of the current snapshot."""
        stats = self._snapshot()
        for figure in _TIER_FIGURES:
            family = figure.family(["tier"])
            for tier in stats.tiers:
                family.add_metric([tier.level.name], getattr(tier, figure.field))
            yield family
        for figures_of, values in ((_CACHE_FIGURES, stats), (_PREFILL_FIGURES, stats.prefill)):
            for figure in figures_of:
                family = figure.family()
                family.add_metric([], getattr(values, figure.field))
                yield family


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
