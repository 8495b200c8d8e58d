"""Output of an ``engine`` run: the TTFT table and the JSON document.

Primitives:
    SCHEMA: the JSON document's schema tag.
    format_table: medians in ms, the ratio of the medians, and the paired ratio judged against the target.
    engine_to_dict: every row, its ratios and targets, and the run's flags.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from .run import EngineRow

SCHEMA = "tiercache-bench/engine/1"


def format_table(rows: Sequence[EngineRow], header: str) -> str:
    """The TTFT table: medians in ms, the ratio of the medians, and the paired ratio (median, lowest and
    highest repeat) that is judged against the target."""
    head: tuple[str, ...] = (
        "prompt",
        "hit%",
        "reused",
        "recompute ms",
        "ideal ms",
        "tiercache ms",
        "load ms",
        "tc/ideal",
    )
    head = (*head, "tc/recompute", "paired (low-high)", "target", "")
    body = [
        (
            str(r.prompt_tokens),
            str(r.hit_percent),
            str(r.tokens_reused),
            f"{r.recompute_s * 1e3:.1f}",
            f"{r.ideal_s * 1e3:.1f}",
            f"{r.tiercache_s * 1e3:.1f}",
            f"{r.load_s * 1e3:.2f}",
            f"{r.vs_ideal:.3f}x",
            f"{r.vs_recompute:.3f}",
            f"{r.paired.median:.3f}x ({r.paired.low:.3f}-{r.paired.high:.3f})",
            r.target,
            "ok" if r.met else "MISSED",
        )
        for r in rows
    ]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i >= 10 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([header, line(head), *(line(b) for b in body)])


def engine_to_dict(rows: Sequence[EngineRow], config: dict[str, Any]) -> dict[str, Any]:
    out = []
    for r in rows:
        item = asdict(r)
        item.update(
            vs_ideal=r.vs_ideal,
            vs_recompute=r.vs_recompute,
            paired=asdict(r.paired),
            target=r.target,
            met=r.met,
        )
        out.append(item)
    return {"schema": SCHEMA, "config": config, "rows": out}
