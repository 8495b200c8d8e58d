"""Output of a ``capacity`` run: the table, the JSON document and the utilisation chart.

Primitives:
    SCHEMA: the ``schema`` field of the JSON document.
    format_capacity_report: one row per (mix, page size), with the target and verdict.
    capacity_to_dict: the config, every row and the verdict as JSON-ready values.
    capacity_charts: utilisation (full and churn median) per mix, one series per page size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..common.documents import jsonable
from ..common.plot import Chart, Series
from ..tables import columns, format_size, met_text
from .run import CapacityConfig, CapacityRow

SCHEMA = "tiercache-bench/capacity/1"


def _pct(share: float) -> str:
    return f"{share * 100:.1f}%"


def _page(row: CapacityRow, config: CapacityConfig) -> str:
    size = format_size(row.page_bytes)
    return f"{size} (one per slot)" if row.page_bytes == config.slot_bytes else size


def format_capacity_report(config: CapacityConfig, rows: Sequence[CapacityRow], elapsed_s: float) -> str:
    """The table: per mix and page size, chunks and utilisation when first full and under churn."""
    head = (
        f"tiercache-bench capacity — a real L2 tier of {format_size(config.capacity_bytes)} with "
        f"{format_size(config.slot_bytes)} slots (shared memory, checksums on); chunk sizes log-uniform in each "
        f"mix (seed {config.seed}); {elapsed_s:.1f} s in all.\n"
        "utilisation = the chunks' own bytes / the configured bytes (Stats' and /metrics' utilisation). full: "
        "stored until the first refusal; churn: "
        f"{config.churn_chunks} more, oldest deleted until each fits, median (lowest-highest) after each store.\n"
    )
    table = [
        [
            r.mix.name,
            _page(r, config),
            str(r.full_chunks),
            _pct(r.full_utilisation),
            str(r.churned),
            f"{_pct(r.churn_median)} ({_pct(r.churn_low)}-{_pct(r.churn_high)})" if r.churned else "-",
            "-" if r.target is None else f">={_pct(r.target)}",
            met_text(r.met),
        ]
        for r in rows
    ]
    headers = ["mix", "page", "chunks full", "full", "churned", "churn", "target", "met?"]
    lines = columns(headers, table, frozenset({0, 1, 7}))
    missed = [f"{r.mix.name} / {format_size(r.page_bytes)}" for r in rows if r.met is False]
    verdict = f"Targets missed: {'; '.join(missed)}." if missed else "Every target met."
    return head + "\n" + "\n".join(lines) + "\n\n" + verdict


def capacity_to_dict(config: CapacityConfig, rows: Sequence[CapacityRow], elapsed_s: float) -> dict[str, Any]:
    """The config, every row (with ``met``) and whether every target was met, as JSON-ready values."""
    return {
        "schema": SCHEMA,
        "command": "capacity",
        "config": jsonable(config),
        "elapsed_s": elapsed_s,
        "rows": [{**jsonable(r), "met": r.met} for r in rows],
        "met": all(r.met is not False for r in rows),
    }


def capacity_charts(config: CapacityConfig, rows: Sequence[CapacityRow]) -> list[Chart]:
    """Utilisation (%) per mix: full and churn median, one pair of series per page size."""
    names = list(dict.fromkeys(r.mix.name for r in rows))
    ticks = tuple((float(i), name) for i, name in enumerate(names))
    series = []
    for page in dict.fromkeys(r.page_bytes for r in rows):
        of_page = [r for r in rows if r.page_bytes == page]
        label = "one page per slot" if page == config.slot_bytes else f"{format_size(page)} pages"
        series.append(
            Series(
                f"{label}, full",
                tuple((float(names.index(r.mix.name)), r.full_utilisation * 100) for r in of_page),
            )
        )
        series.append(
            Series(
                f"{label}, churn median",
                tuple((float(names.index(r.mix.name)), r.churn_median * 100) for r in of_page if r.churned),
                dashed=True,
            )
        )
    return [
        Chart(
            "capacity: utilisation of the configured bytes",
            "chunk-size mix",
            "percent",
            tuple(series),
            x_ticks=ticks,
        )
    ]
