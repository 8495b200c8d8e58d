"""The table, JSON rows and charts of ``tiercache-bench serve``.

One row per (workload, fits|outgrows, concurrency, column): requests/s (successful requests over the wall
time), output tokens/s, TTFT p50/p90/p99, ITL p50, failed requests, prompt tokens by where they came from
(vLLM's own prefix cache and the connector, as vLLM's ``/metrics`` counted them; the daemon's L2 / L3 /
shared-tier tokens from its ``Stats``; recomputed = prompt tokens less what vLLM reported cached),
whole-turn reuse (follow-up turns whose whole previous turn came back), the ratios against plain vLLM and
the ideal, greedy mismatches against plain vLLM (or the ideal when plain did not run), how fast the host ran
around the row (its speed probe against the run's median: a figure from one of a shared host's slow phases
shows there), and the issue's
targets for the tiercache columns, met or NO (never asserted). With repeats, each figure is the median of
the repeats and the spread of requests/s is printed. Under the table, per tiercache row, what the connector's
scheduler side did (vLLM's ``/metrics``): its lookups, the steps a request was skipped for because its answer
came late, how long vLLM's scheduler waited for answers per lookup, and how long the model steps waited for
loads per 1,000 tokens loaded.

Targets: outgrows: >= 0.95x the ideal's requests/s, TTFT p50 <= 1.2x the ideal's, >= 2x plain's requests/s;
fits: >= 0.98x plain's requests/s, TTFT p50 and p99 <= 1.05x plain's.

Primitives:
    SCHEMA: the JSON document's schema tag.
    rows: the rows.
    format_table: the table.
    charts: TTFT CDF and requests/s per column.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from ..common.plot import Chart, Series
from ..tables import columns as table_columns
from .client import Outcome
from .columns import TIERCACHE, ColumnKind
from .run import Cell, Measured, ServeResult

SCHEMA = "tiercache-bench/serve/1"


def _pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


def _figures(m: Measured) -> dict[str, Any]:
    ok = [o for o in m.outcomes if not o.error]
    ttfts = [o.ttft_s * 1e3 for o in ok]
    itls = [o.itl_s * 1e3 for o in ok if len(o.output) > 1]
    prompt_tokens = sum(o.prompt_tokens for o in ok)
    cached = sum(o.cached_tokens for o in ok)
    follow = [o for o in ok if o.reusable_tokens > 0]
    tiers = {name: (eff or loaded) for name, (loaded, eff) in m.tiers.items()}
    return {
        "requests": len(m.outcomes),
        "failed": len(m.outcomes) - len(ok),
        "wall_s": m.wall_s,
        "req_per_s": len(ok) / m.wall_s if m.wall_s > 0 else 0.0,
        "out_tok_per_s": sum(len(o.output) for o in ok) / m.wall_s if m.wall_s > 0 else 0.0,
        "ttft_p50_ms": _pct(ttfts, 0.5),
        "ttft_p90_ms": _pct(ttfts, 0.9),
        "ttft_p99_ms": _pct(ttfts, 0.99),
        "itl_p50_ms": _pct(itls, 0.5),
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached,
        "vllm_cache_tokens": m.vllm_hits,
        "connector_tokens": m.connector_hits,
        "l2_tokens": tiers.get("L1", 0) + tiers.get("L2", 0),
        "l3_tokens": tiers.get("L3", 0),
        "shared_tokens": tiers.get("SHARED", 0),
        "daemon_tiers": {
            k: {"load_success_tokens": v[0], "effective_hit_tokens": v[1]} for k, v in m.tiers.items()
        },
        "recomputed_tokens": prompt_tokens - cached,
        "follow_ups": len(follow),
        "whole_turns": sum(1 for o in follow if o.cached_tokens >= o.reusable_tokens),
        "lookups": int(m.counters.get("lookups", 0)),
        "index_answers": int(m.counters.get("index_answers", 0)),
        "late_answers": int(m.counters.get("late_answers", 0)),
        # offered to vLLM (in its connector count) and then not loaded: a load error, vLLM recomputed them
        "offered_recomputed_tokens": int(m.counters.get("recomputed_tokens", 0)),
        "ask_wait_ms_per_lookup": (
            1000 * m.counters["ask_wait_seconds"] / m.counters["lookups"]
            if m.counters.get("lookups")
            else None
        ),
        "load_ms_per_1k_tokens": (
            1e6 * m.counters["load_seconds"] / m.counters["loaded_tokens"]
            if m.counters.get("loaded_tokens")
            else None
        ),
        "queue_ms_mean": _per(m.engine, "request_queue_time_seconds"),
        "prefill_ms_mean": _per(m.engine, "request_prefill_time_seconds"),
        "preemptions": int(m.engine.get("num_preemptions_total", 0)),
        "daemon_restarted": m.daemon_restarted,
        "host_probe_ms": m.host_probe_ms,
    }


def _per(engine: dict[str, float], histogram: str) -> float | None:
    """The mean of one of vLLM's time histograms during the cell, in ms (None: nothing observed)."""
    count = engine.get(f"{histogram}_count", 0)
    return 1000 * engine[f"{histogram}_sum"] / count if count else None


def _median(values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    if not present:
        return None
    if isinstance(present[0], bool):
        return any(present)
    if isinstance(present[0], int):
        return round(statistics.median(present))  # token and request counts stay whole
    if isinstance(present[0], float):
        return statistics.median(present)
    return present[0]


def _outputs(m: Measured) -> dict[tuple[int, int], tuple[int, ...]]:
    return {(o.session, o.turn): o.output for o in m.outcomes if not o.error}


def _mismatches(ours: Sequence[Measured], ref: Sequence[Measured]) -> int | None:
    if not ref:
        return None
    want = _outputs(ref[0])
    return sum(1 for m in ours for k, v in _outputs(m).items() if k in want and want[k] != v)


def _targets(cell: Cell, row: dict[str, Any]) -> dict[str, bool | None]:
    def le(a: float | None, bound: float) -> bool | None:
        return None if a is None else a <= bound

    def ge(a: float | None, bound: float) -> bool | None:
        return None if a is None else a >= bound

    if cell.fits:
        return {"req_per_s >= 0.98x plain": ge(row["req_per_s_vs_plain"], 0.98),
                "ttft_p50 <= 1.05x plain": le(row["ttft_p50_vs_plain"], 1.05),
                "ttft_p99 <= 1.05x plain": le(row["ttft_p99_vs_plain"], 1.05)}  # fmt: skip
    return {"req_per_s >= 0.95x ideal": ge(row["req_per_s_vs_ideal"], 0.95),
            "ttft_p50 <= 1.2x ideal": le(row["ttft_p50_vs_ideal"], 1.2),
            "req_per_s >= 2x plain": ge(row["req_per_s_vs_plain"], 2.0)}  # fmt: skip


def rows(result: ServeResult) -> list[dict[str, Any]]:
    """One row per (workload, fits, concurrency, column) that ran (see the module docstring)."""
    by: dict[tuple[Cell, ColumnKind], list[Measured]] = {}
    for m in result.measured:
        by.setdefault((m.cell, m.column), []).append(m)
    # One server's cell recorded as several rows (a big server is plain's "fits" and the ideal's "outgrows",
    # sharing the cell's outcomes) was probed once: it counts once in the run's median.
    probed = {id(m.outcomes): m.host_probe_ms for m in result.measured if m.host_probe_ms is not None}
    usual = statistics.median(probed.values()) if probed else None
    out = []
    for cell, workload in result.workloads.items():
        figs = {col: [_figures(m) for m in ms] for (c, col), ms in by.items() if c == cell}
        med = {col: {k: _median([f[k] for f in fs]) for k in fs[0]} for col, fs in figs.items()}
        ref = by.get((cell, ColumnKind.PLAIN)) or by.get((cell, ColumnKind.IDEAL)) or []
        for col in ColumnKind:
            if col not in med:
                continue
            row: dict[str, Any] = {"workload": cell.workload.value, "fits": cell.fits, "concurrency": cell.concurrency,
                                   "column": col.value, "sessions": len(workload.sessions),
                                   "working_set_tokens": workload.working_set_tokens, **med[col]}  # fmt: skip
            rps = [f["req_per_s"] for f in figs[col]]
            row["req_per_s_spread"] = [min(rps), max(rps)]
            row["repeats"] = len(rps)
            # the host's speed probe around the row's cells against the run's median: above ~1.1x, a slow phase
            row["host_vs_run"] = _ratio(row["host_probe_ms"], usual)
            for base in ("plain", "ideal"):
                other = med.get(ColumnKind(base))
                for key in ("req_per_s", "ttft_p50_ms", "ttft_p99_ms"):
                    name = f"{key.removesuffix('_ms')}_vs_{base}"
                    row[name] = _ratio(row[key], other[key]) if other else None
            row["ratios"] = {k: row[k] for k in list(row) if "_vs_" in k}
            ideal = med.get(ColumnKind.IDEAL)
            row["ideal_whole_turns"] = ideal["whole_turns"] if ideal else None
            row["greedy_mismatches"] = (
                None if not ref else 0 if ref is by[(cell, col)] else _mismatches(by[(cell, col)], ref)
            )
            row["targets"] = _targets(cell, row) if col in TIERCACHE else {}
            out.append(row)
    return out


def _f(value: float | None, spec: str = ".1f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def format_table(result: ServeResult) -> str:
    """The table, then the skipped columns, the engine caches and the daemon kill."""
    body = []
    for r in rows(result):
        targets = r["targets"]
        verdict = "-" if not targets else ("met" if all(targets.values()) else "NO")
        body.append([
            r["workload"], "fits" if r["fits"] else "outgrows", str(r["concurrency"]), r["column"],
            _f(r["req_per_s"], ".2f"), _f(r["out_tok_per_s"], ".0f"), _f(r["ttft_p50_ms"]), _f(r["ttft_p90_ms"]),
            _f(r["ttft_p99_ms"]), _f(r["itl_p50_ms"]), str(r["failed"]), str(r["vllm_cache_tokens"]), str(r["connector_tokens"]),
            str(r["l2_tokens"]), str(r["l3_tokens"]), str(r["shared_tokens"]), str(r["recomputed_tokens"]),
            f"{r['whole_turns']}/{r['follow_ups']}" if r["follow_ups"] else "-",
            _f(r["req_per_s_vs_plain"], ".2f", "x"), _f(r["ttft_p50_vs_plain"], ".2f", "x"),
            _f(r["req_per_s_vs_ideal"], ".2f", "x"), _f(r["ttft_p50_vs_ideal"], ".2f", "x"),
            "-" if r["greedy_mismatches"] is None else str(r["greedy_mismatches"]),
            _f(r["host_vs_run"], ".2f", "x"), verdict,
        ])  # fmt: skip
    headers = ["workload", "set", "conc", "column", "req/s", "tok/s", "ttft50", "ttft90", "ttft99", "itl50",
               "fail", "vllm", "conn", "L2", "L3", "shared", "recomp", "turns", "rps/pl", "t50/pl", "rps/id", "t50/id",
               "mism", "host", "target"]  # fmt: skip
    lines = table_columns(headers, body, frozenset({0, 1, 3}))
    lines.append(
        "(ms for TTFT/ITL; prompt tokens from vLLM's cache / the connector (vLLM's count) / the daemon's L2, L3,"
        " shared tiers (its Stats: engine-reported tokens, else loaded ones) / recomputed; turns: follow-ups that got their whole previous turn back;"
        " host: the host's speed probe around the row against the run's median, above ~1.1x a slow phase)"
    )
    for r in rows(result):
        if r["repeats"] > 1:
            lo, hi = r["req_per_s_spread"]
            lines.append(f"spread {r['workload']} {'fits' if r['fits'] else 'outgrows'} c={r['concurrency']} "
                         f"{r['column']}: req/s {lo:.2f}-{hi:.2f} over {r['repeats']} repeats")  # fmt: skip
    for r in rows(result):
        if r["lookups"] or r["index_answers"]:
            lines.append(f"asking {r['workload']} {'fits' if r['fits'] else 'outgrows'} c={r['concurrency']} "
                         f"{r['column']}: {r['index_answers']} answers from the index, {r['lookups']} lookups,"
                         f" {r['late_answers']} steps skipped for a late answer,"
                         f" {r['offered_recomputed_tokens']} offered tokens recomputed (load errors),"
                         f" the scheduler waited {_f(r['ask_wait_ms_per_lookup'], '.2f')} ms per lookup; the model steps"
                         f" waited {_f(r['load_ms_per_1k_tokens'], '.2f')} ms per 1,000 tokens loaded")  # fmt: skip
    for r in rows(result):
        if r["queue_ms_mean"] is not None:
            lines.append(f"engine {r['workload']} {'fits' if r['fits'] else 'outgrows'} c={r['concurrency']} "
                         f"{r['column']}: requests queued {_f(r['queue_ms_mean'])} ms before their first step (mean;"
                         f" for blocks, or a late answer), then {_f(r['prefill_ms_mean'])} ms to their first token"
                         f" (the prefill, loads included); {r['preemptions']} preemptions")  # fmt: skip
    for name, why in result.skipped.items():
        lines.append(f"{name}: skipped ({why})")
    lines.append("engine KV cache (tokens, read back): "
                 + ", ".join(f"{k} {v}" for k, v in result.engine_tokens.items()))  # fmt: skip
    lines.extend(_live_note(result))
    if result.kill is not None:
        k = result.kill
        lines.append(f"daemon kill ({k.column}): killed at {k.killed_at_s:.1f} s, restarted at {k.restarted_at_s:.1f} s,"
                     f" failed requests {k.failed_requests}; after the restart: daemon served {k.hit_tokens_after} tokens,"
            f" probe {k.probe_requests} requests, {k.probe_failed} failed, {k.probe_connector_tokens} tokens from the connector"
                     + (f" ({k.error})" if k.error else ""))  # fmt: skip
    lines.append(f"run wall time {result.wall_s:.0f} s")
    return "\n".join(lines)


def _live_note(result: ServeResult) -> list[str]:
    """How many of the requests in flight the outgrowing engines' cache holds: fewer than the concurrency
    caps their batch (vLLM queues the rest), which the ideal's cache does not, whatever a cache tier does."""
    small = [v for k, v in result.engine_tokens.items() if k.endswith("-small")]
    if not small or not result.longest_request or not result.measured:
        return []
    top = max(m.cell.concurrency for m in result.measured)
    holds = min(small) / result.longest_request
    line = (
        f"outgrowing engines' cache: {min(small)} tokens = {holds:.1f} longest requests"
        f" ({result.longest_request} tokens) at concurrency {top}"
    )
    if holds < top:
        line += "; it caps their batch below the concurrency (the ideal's lead is then partly batch size)"
    return [line]


def _cdf(outcomes: Sequence[Outcome]) -> tuple[tuple[float, float], ...]:
    ttfts = sorted(o.ttft_s * 1e3 for o in outcomes if not o.error)
    return tuple((t, (i + 1) / len(ttfts)) for i, t in enumerate(ttfts))


def charts(result: ServeResult) -> list[Chart]:
    """Per (workload, fits): the TTFT CDF of each column at the highest concurrency, and requests/s against
    concurrency per column."""
    out = []
    keys = sorted({(m.cell.workload.value, m.cell.fits) for m in result.measured})
    for workload, fits in keys:
        ms = [
            m
            for m in result.measured
            if m.cell.workload.value == workload and m.cell.fits == fits and m.repeat == 0
        ]
        top = max(m.cell.concurrency for m in ms)
        label = f"{workload} {'fits' if fits else 'outgrows'}"
        cdf = tuple(Series(m.column.value, _cdf(m.outcomes)) for m in ms if m.cell.concurrency == top)
        out.append(Chart(f"{label}: TTFT CDF, concurrency {top}", "TTFT ms", "fraction", cdf))
        rps = tuple(
            Series(
                col.value,
                tuple((float(m.cell.concurrency), _figures(m)["req_per_s"]) for m in ms if m.column is col),
            )
            for col in ColumnKind
            if any(m.column is col for m in ms)
        )
        out.append(Chart(f"{label}: requests/s", "concurrency", "req/s", rps))
    return out
