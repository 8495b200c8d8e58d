"""Output of a ``singleflight`` run: per mode, then per request.

Primitives:
    format_single_flight: the plain-text report.
"""

from __future__ import annotations

from ..tables import columns
from .run import SingleFlightReport


def format_single_flight(report: SingleFlightReport) -> str:
    """The plain-text report: per mode, then per request."""
    c = report.config
    lines = [
        f"single-flight prefill: {c.requests} identical requests on a cold cache, {c.chunks} chunks x "
        f"{c.chunk_tokens} tokens ({report.prompt_tokens} tokens), synthetic prefill "
        f"{c.prefill_tokens_per_s:g} tokens/s "
        + ("on one shared accelerator" if c.shared_compute else "per request"),
        "",
    ]
    rows = [
        [m.mode, str(m.prefill_tokens), f"{m.mean_ready_s:.3f}", f"{m.max_ready_s:.3f}"] for m in report.modes
    ]
    lines += columns(["mode", "prefill tokens", "mean ready s", "max ready s"], rows, frozenset({0}))
    lines += ["", "per request (seconds from arrival):"]
    rrows = [
        [
            m.mode,
            str(r.request),
            r.role,
            f"{r.waited_s:.3f}",
            str(r.loaded_tokens),
            str(r.computed_tokens),
            f"{r.first_load_s:.3f}",
            f"{r.ready_s:.3f}",
            "yes" if r.exact else "NO",
        ]
        for m in report.modes
        for r in m.requests
    ]
    headers = ["mode", "request", "role", "waited", "loaded", "computed", "first load", "ready", "exact"]
    lines += columns(headers, rrows, frozenset({0, 2, 8}))
    return "\n".join(lines)
