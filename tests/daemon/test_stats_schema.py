"""The daemon's metric families are derived from the stats schema: one family per figure, with the
figure's help text and kind, under the names operators scrape."""

from __future__ import annotations

import dataclasses

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from tiercache.daemon.metrics import StatsCollector, figures
from tiercache.stats import CacheStats, PrefillStats, StatKind, TierStats, stat_info
from tiercache.tiers.base import TierLevel

_NAMES = {
    "tiercache_tier_chunks": "gauge",
    "tiercache_tier_used_bytes": "gauge",
    "tiercache_tier_capacity_bytes": "gauge",
    "tiercache_tier_hits": "counter",
    "tiercache_tier_misses": "counter",
    "tiercache_tier_evictions": "counter",
    "tiercache_tier_promotions": "counter",
    "tiercache_tier_demotions": "counter",
    "tiercache_tier_corrupt_reads": "counter",
    "tiercache_tier_dropped_chunks": "counter",
    "tiercache_lookup_hit_tokens": "counter",
    "tiercache_load_success_tokens": "counter",
    "tiercache_effective_hit_tokens": "counter",
    "tiercache_tier_read_latency_seconds": "gauge",
    "tiercache_tier_read_bytes_per_second": "gauge",
    "tiercache_namespaces": "gauge",
    "tiercache_active_leases": "gauge",
    "tiercache_expired_leases": "counter",
    "tiercache_single_flight_joins": "counter",
    "tiercache_pending_writes": "gauge",
    "tiercache_failed_writes": "counter",
    "tiercache_recomputed_tokens": "counter",
    "tiercache_deferred_writes": "gauge",  # the watermark policy's backlog (added with it)
    "tiercache_prefill_active_claims": "gauge",
    "tiercache_prefill_claimed_chunks": "gauge",
    "tiercache_prefill_waits": "counter",
    "tiercache_prefill_takeovers": "counter",
    "tiercache_prefill_expired_claims": "counter",
    "tiercache_tier_errors": "counter",  # the shared tier's failed store calls (added with it)
    "tiercache_tier_payload_bytes": "gauge",  # the chunks' own bytes (added with pages)
    "tiercache_tier_utilisation": "gauge",  # payload / capacity (added with pages)
}
"""The families the daemon exported before the schema drove them (names operators' dashboards use)."""


def _stats() -> CacheStats:
    l2 = TierStats(TierLevel.L2, 3, 300, 1000, 7, 2, 1, 4, 5, 6, 11, 12, 13, 0.001, 2e9)
    l3 = TierStats(TierLevel.L3, 9, 900, 5000, 1, 8, 0, 0, 3, 2, 21, 22, 23, 0.004, 5e8)
    return CacheStats((l2, l3), 2, 1, 4, 6, 0, 3, PrefillStats(1, 2, 3, 4, 5), recomputed_tokens=99)


def test_one_family_per_figure_under_the_names_operators_scrape() -> None:
    families = {f.name: f for f in StatsCollector(_stats).collect()}
    assert {name: f.type for name, f in families.items()} == _NAMES
    figure_count = sum(
        1 for cls in (TierStats, CacheStats, PrefillStats) for f in dataclasses.fields(cls) if stat_info(f)
    )
    assert len(families) == figure_count


def test_families_carry_the_schema_help_kind_and_values() -> None:
    families = {f.name: f for f in StatsCollector(_stats).collect()}
    for figure in figures(TierStats) + figures(CacheStats) + figures(PrefillStats):
        family = families[figure.metric]
        assert family.documentation == figure.info.help
        expected = GaugeMetricFamily if figure.info.kind is StatKind.GAUGE else CounterMetricFamily
        assert family.type == expected("x", "x").type
    corrupt = families["tiercache_tier_corrupt_reads"]
    assert [(s.labels, s.value) for s in corrupt.samples if s.name.endswith("_total")] == [
        ({"tier": "L2"}, 6),
        ({"tier": "L3"}, 2),
    ]
    latency = families["tiercache_tier_read_latency_seconds"]
    assert [(s.labels["tier"], s.value) for s in latency.samples] == [("L2", 0.001), ("L3", 0.004)]
    assert families["tiercache_recomputed_tokens"].samples[0].value == 99
    assert families["tiercache_prefill_expired_claims"].samples[0].value == 5
    assert families["tiercache_namespaces"].samples[0].value == 2
