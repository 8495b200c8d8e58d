"""``sglang``'s table and JSON document.

Primitives:
    format_sglang: the table.
    sglang_document: every figure as a JSON-ready dict.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from .run import SglangReport


def format_sglang(report: SglangReport) -> str:
    """The table: GB/s of each call (median, lowest-highest round) and its ratio to memcpy."""
    c = report.config
    lines = [
        f"sglang: {c.pages} pages of {c.page_bytes / 2**20:.2f} MiB per call ({c.layout}, {c.layers} layers x "
        f"{c.kv_heads} KV heads x {c.head_dim}, bfloat16, {c.page_tokens} tokens a page), "
        f"{c.rounds} rounds, data plane {report.data_plane}",
        f"{'call':<14} {'GB/s (low-high)':<24} vs memcpy (per round)",
        f"{'batch_set_v1':<14} {report.set_gbps.text('.2f'):<24} {report.set_vs_memcpy.text()}",
        f"{'batch_get_v1':<14} {report.get_gbps.text('.2f'):<24} {report.get_vs_memcpy.text()}",
        f"{'memcpy':<14} {report.memcpy_gbps.text('.2f'):<24} (the same bytes in page-size copies)",
        f"{'batch_exists':<14} {report.exists_ms.text('.2f')} ms",
        f"loads {'complete and bit-exact' if report.verified else 'INCOMPLETE OR CHANGED'}",
    ]
    return "\n".join(lines)


def sglang_document(report: SglangReport) -> dict[str, Any]:
    """Every figure of ``report``, JSON-ready."""
    doc = asdict(report)
    doc["config"]["data_plane"] = report.config.data_plane.value
    return doc
