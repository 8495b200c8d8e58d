"""tiercache's counters in vLLM's own stats: its logged "KV Transfer metrics" line and its ``/metrics``.

vLLM asks each connector for the stats of the last interval (``get_kv_connector_stats``: the worker's after
every model step, travelling in ``KVConnectorOutput``; the scheduler's after every engine step), aggregates
them, rebuilds them in its logging process through the connector class's ``build_kv_connector_stats`` and
hands the data to the Prometheus metrics the class made with ``build_prom_metrics``.

:class:`StatsTaker` turns the connector's cumulative counters (the worker's tokens loaded per source tier,
recomputed and saved, its failures, the time it spent loading and saving; the scheduler's lookups, misses,
hit tokens, failures, late answers and time waited for answers) into the interval's :class:`TierCacheStats` (counter deltas, keyed by
:data:`FIELDS`). :class:`TierCachePromMetrics` adds them to one Prometheus counter per field, named
``vllm:tiercache_<field>`` (with a ``tier`` label for the per-tier fields), on the engine's label values.

Primitives:
    FIELDS: every counter, with its help.
    PER_TIER: the per-tier counters (data keys ``<field>.<tier>``).
    TierCacheStats: vLLM's ``KVConnectorStats`` of tiercache.
    worker_counters, scheduler_counters: the cumulative counters of each side.
    StatsTaker: ``take(counters)`` -> the interval's TierCacheStats (None when nothing changed).
    TierCachePromMetrics: vLLM's ``KVConnectorPromMetrics`` of tiercache.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats

from tiercache.tiers.base import TierLevel

from .scheduler import SchedulerSide
from .worker import WorkerSide

FIELDS: dict[str, str] = {
    "loaded_tokens": "Tokens tiercache wrote into vLLM's KV blocks (vLLM did not compute them), by source tier.",
    "recomputed_tokens": "Tokens vLLM was offered from tiercache and computed anyway (not loaded in time).",
    "saved_tokens": "Tokens of chunks vLLM stored in tiercache (added by the daemon).",
    "load_seconds": "Time vLLM's model steps waited for tiercache loads.",
    "save_seconds": "Time spent saving KV to tiercache (in the background, off the model step).",
    "lookups": "Daemon lookups made (one per scheduler batch and namespace).",
    "index_answers": "Requests answered from the daemon's published L2 index, with no daemon call.",
    "lookup_hit_tokens": "Tokens beyond vLLM's own prefix cache that tiercache offered at lookups.",
    "lookup_misses": "Requests looked up of which tiercache held no block beyond vLLM's own cache.",
    "lookup_failures": "Lookups that failed (daemon down or slow): the requests recomputed.",
    "late_answers": "Steps a request was skipped for: tiercache's answer came after the step's wait.",
    "ask_wait_seconds": "Time vLLM's scheduler waited for tiercache's answers.",
    "load_failures": "Loads that failed or came short (vLLM recomputed the blocks).",
    "save_failures": "Saves the daemon refused or failed (the request was not cached).",
}
"""Every counter of :class:`TierCacheStats`, with its help."""
PER_TIER = frozenset({"loaded_tokens"})
"""Counters kept per tier (data keys ``<field>.<tier name>``)."""


@dataclass
class TierCacheStats(KVConnectorStats):  # type: ignore[misc]
    """Counter deltas of one interval (``data``: key -> number, keys from :data:`FIELDS`)."""

    def reset(self) -> None:
        self.data = dict[str, Any]()

    def aggregate(self, other: KVConnectorStats) -> TierCacheStats:
        merged = dict(self.data)
        for key, value in other.data.items():
            merged[key] = merged.get(key, 0) + value
        return TierCacheStats(data=merged)

    def reduce(self) -> dict[str, int | float]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in sorted(self.data.items()) if v}

    def is_empty(self) -> bool:
        return not any(self.data.values())


def worker_counters(worker: WorkerSide) -> dict[str, float]:
    """The worker side's cumulative counters."""
    counters: dict[str, float] = {f"loaded_tokens.{t.name}": n for t, n in worker.loaded_tokens.items()}
    counters.update(
        recomputed_tokens=worker.recomputed_tokens,
        saved_tokens=worker.saved_tokens,
        load_seconds=worker.load_s,
        save_seconds=worker.save_s,
        load_failures=worker.load_failures,
        save_failures=worker.save_failures,
    )
    return counters


def scheduler_counters(scheduler: SchedulerSide) -> dict[str, float]:
    """The scheduler side's cumulative counters."""
    return {
        "lookups": scheduler.lookups,
        "index_answers": scheduler.index_answers,
        "lookup_hit_tokens": scheduler.lookup_hit_tokens,
        "lookup_misses": scheduler.lookup_misses,
        "lookup_failures": scheduler.lookup_failures,
        "late_answers": scheduler.late_answers,
        "ask_wait_seconds": scheduler.ask_wait_s,
    }


class StatsTaker:
    """The deltas of cumulative counters since the last :meth:`take`."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}

    def take(self, counters: Mapping[str, float]) -> TierCacheStats | None:
        """The interval's stats (None when no counter moved)."""
        delta = {k: v - self._last.get(k, 0) for k, v in counters.items() if v != self._last.get(k, 0)}
        if not delta:
            return None
        self._last.update(counters)
        return TierCacheStats(data=delta)


class TierCachePromMetrics(KVConnectorPromMetrics):  # type: ignore[misc]
    """One Prometheus counter per :data:`FIELDS` entry, per engine (and per tier for :data:`PER_TIER`)."""

    def __init__(
        self,
        vllm_config: Any,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._children: dict[tuple[str, int], Any] = {}
        self._tier_children: dict[tuple[str, int, str], Any] = {}
        self._per_tier: dict[str, Any] = {}
        for name, doc in FIELDS.items():
            tiered = name in PER_TIER
            counter = self._counter_cls(
                name=f"vllm:tiercache_{name}",
                documentation=doc,
                labelnames=[*labelnames, "tier"] if tiered else labelnames,
            )
            if tiered:
                self._per_tier[name] = counter
                for idx, values in per_engine_labelvalues.items():
                    for tier in (TierLevel.L1, TierLevel.L2, TierLevel.L3, TierLevel.SHARED):
                        self._tier_children[(name, idx, tier.name)] = counter.labels(*values, tier.name)
            else:
                for idx, values in per_engine_labelvalues.items():
                    self._children[(name, idx)] = counter.labels(*values)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for key, value in transfer_stats_data.items():
            if not value or value < 0:
                continue
            name, _, tier = key.partition(".")
            child = (
                self._tier_children.get((name, engine_idx, tier))
                if tier
                else self._children.get((name, engine_idx))
            )
            if child is not None:
                child.inc(value)
