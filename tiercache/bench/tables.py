"""Plain-text tables of the benchmark reports.

Primitives:
    format_size: ``262144`` -> ``256 KiB``.
    columns: aligned plain-text columns (text to the left, numbers to the right).
    ratio_text / target_text / met_text: how a ratio, its target and the verdict are shown.
"""

from __future__ import annotations

from collections.abc import Sequence

_UNITS = (("GiB", 30), ("MiB", 20), ("KiB", 10))


def format_size(nbytes: int) -> str:
    """Binary-unit size: ``256 KiB``, ``1 MiB``, ``1.5 MiB``, ``100 B``."""
    for unit, shift in _UNITS:
        if nbytes >= 1 << shift:
            value = nbytes / (1 << shift)
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{nbytes} B"


def columns(headers: Sequence[str], rows: Sequence[Sequence[str]], left: frozenset[int]) -> list[str]:
    """Align columns: those in ``left`` to the left, the others (numbers) to the right."""
    widths = [max(len(r[i]) for r in (headers, *rows)) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.ljust(w) if i in left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    return [line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def ratio_text(ratio: float | None) -> str:
    """``0.93x``, or ``-`` when there is no ratio."""
    return "-" if ratio is None else f"{ratio:.2f}x"


def target_text(target: float | None, at_most: bool = False) -> str:
    """``>=0.8x`` (or ``<=2.0x`` with ``at_most``), or ``-`` when untargeted."""
    if target is None:
        return "-"
    return f"{'<=' if at_most else '>='}{target:.1f}x"


def met_text(met: bool | None) -> str:
    """``yes``, ``NO`` or ``-`` (untargeted)."""
    return "-" if met is None else ("yes" if met else "NO")
