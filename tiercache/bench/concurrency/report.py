"""Output of a ``concurrency`` run: the plain-text table (the JSON document is the run's own).

Primitives:
    format_table: one row per (chunk size, threads), GB/s next to the memcpy ceiling of that chunk size.
"""

from __future__ import annotations

from typing import Any

from ..tables import columns, format_size


def format_table(doc: dict[str, Any]) -> str:
    """One row per (chunk size, threads): GB/s next to the memcpy ceiling of that chunk size."""
    ceiling = {c["chunk_bytes"]: c["gbps"] for c in doc["ceilings"]}
    rows = [
        [
            format_size(r["chunk_bytes"]),
            str(r["threads"]),
            f"{r['gbps']:.2f}",
            f"{ceiling[r['chunk_bytes']]:.2f}",
            f"{r['gbps'] / ceiling[r['chunk_bytes']]:.2f}",
            f"{r['p50_ms']:.3f}",
            f"{r['p99_ms']:.3f}",
            format_size(r["verified_bytes"]),
        ]
        for r in doc["results"]
    ]
    headers = ["chunk", "threads", "GB/s", "memcpy GB/s", "ratio", "p50 ms", "p99 ms", "verified"]
    title = f"concurrency: put+get round trips through {doc['manager']} on {','.join(doc['config']['tiers'])}"
    return "\n".join([title, *columns(headers, rows, frozenset({0}))])
