"""Output of a ``fleet`` run: both modes as a table and as JSON-ready data.

Primitives:
    fleet_to_dict: the report as JSON-ready data.
    format_fleet: the report as a table.
"""

from __future__ import annotations

from tiercache.tiers.base import TierLevel

from ..tables import columns
from .run import FleetReport, ModeResult


def fleet_to_dict(report: FleetReport) -> dict[str, object]:
    """The report as JSON-ready data."""
    c = report.config

    def mode(m: ModeResult) -> dict[str, object]:
        return {
            "shared": m.shared,
            "requests": m.requests,
            "prompt_tokens": m.prompt_tokens,
            "lookup_hit_tokens": m.lookup_hit_tokens,
            "saved_tokens": m.saved_tokens,
            "saved_tokens_by_tier": {lv.name: t for lv, t in m.loaded_tokens.items()},
            "effective_hit_rate": m.effective_hit_rate,
            "stored_tokens": m.stored_tokens,
            "verified_bytes": m.verified_bytes,
            "shared_errors": m.shared_errors,
            "elapsed_s": m.elapsed_s,
        }

    return {
        "command": "fleet",
        "hosts": c.hosts,
        "trace": c.trace.value,
        "requests": c.spec.requests,
        "chunk_bytes": c.layout.chunk_bytes,
        "chunk_tokens": c.layout.chunk_tokens,
        "l2_bytes": c.l2_bytes,
        "l3_bytes": c.l3_bytes,
        "store": report.store,
        "modes": [mode(report.off), mode(report.on)],
    }


def format_fleet(report: FleetReport) -> str:
    """Both modes as one table."""
    head = [
        "shared tier",
        "requests",
        "prompt tok",
        "lookup hit",
        "saved (L2/L3/SHARED)",
        "eff. hit",
        "errors",
        "s",
    ]
    rows = []
    for m in (report.off, report.on):
        by = "/".join(
            str(m.loaded_tokens.get(lv, 0)) for lv in (TierLevel.L2, TierLevel.L3, TierLevel.SHARED)
        )
        rows.append(
            [
                "on" if m.shared else "off",
                str(m.requests),
                str(m.prompt_tokens),
                str(m.lookup_hit_tokens),
                f"{m.saved_tokens} ({by})",
                f"{m.effective_hit_rate:.3f}",
                str(m.shared_errors),
                f"{m.elapsed_s:.1f}",
            ]
        )
    c = report.config
    title = (
        f"fleet: {c.trace.value} trace, {c.spec.requests} requests over {c.hosts} hosts "
        f"(L2 {c.l2_bytes >> 20} MiB each, L3 {c.l3_bytes >> 20} MiB each); store: {report.store}"
    )
    return "\n".join([title, *columns(head, rows, frozenset({0}))])
