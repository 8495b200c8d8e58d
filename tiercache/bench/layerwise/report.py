"""Output of a ``layerwise`` run: totals against the compute-only floor, then the layerwise timeline.

Primitives:
    format_layerwise: the plain-text report.
"""

from __future__ import annotations

from ..tables import columns, format_size
from .run import LayerwiseReport


def format_layerwise(report: LayerwiseReport) -> str:
    """The plain-text report: totals, then the layerwise timeline."""
    c = report.config
    head = (
        f"layerwise load vs load-then-compute: {c.layers} layers x {c.chunks} chunks of "
        f"{format_size(report.chunk_bytes)} ({report.tokens} tokens, bf16); copy {report.copy_ms_per_layer:.2f} "
        f"ms/layer, compute {report.compute_ms_per_layer:.2f} ms/layer; median of {c.repeats}"
    )
    floor = report.compute_only_ms
    totals = [
        ("compute only (floor)", floor),
        (f"load all ({report.load_ms:.1f} ms), then compute", report.load_then_compute_ms),
        ("layerwise: wait_layer(l), compute l", report.layerwise_ms),
    ]
    rows = [[name, f"{ms:.1f}", f"{ms / floor:.2f}x" if floor > 0 else "-"] for name, ms in totals]
    lines = [head, "", *columns(["mode", "total ms", "vs floor"], rows, frozenset({0}))]
    lines += [
        "",
        f"overlap saved {report.overlap_saved_ms:.1f} ms",
        "",
        "layerwise timeline (ms from the start):",
    ]
    trows = [
        [
            str(t.layer),
            f"{t.copy_start_ms:.2f}",
            f"{t.copy_end_ms:.2f}",
            f"{t.compute_start_ms:.2f}",
            f"{t.compute_end_ms:.2f}",
        ]
        for t in report.timeline
    ]
    lines += columns(["layer", "copy start", "copy end", "compute start", "compute end"], trows, frozenset())
    return "\n".join(lines)
