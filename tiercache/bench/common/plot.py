"""PNG line charts of benchmark results (matplotlib, imported only when a plot is asked for).

Primitives:
    Series: one line: a label, its (x, y) points and optional error bars.
    Chart: a titled chart of several series.
    PlotUnavailableError: matplotlib is not installed (``pip install 'tiercache[bench]'``).
    save_chart: draw a chart into a PNG file (Agg backend, no display needed).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Series:
    """One line of a chart.

    Attributes:
        label: the legend entry.
        points: ``(x, y)`` pairs, drawn in x order.
        dashed: draw a dashed line (for ceilings and baselines).
        errors: per point (same order as ``points``), the lowest and highest y, drawn as an error bar
            (e.g. the slowest and fastest of several rounds around their median); empty: no bars.
    """

    label: str
    points: tuple[tuple[float, float], ...]
    dashed: bool = False
    errors: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Chart:
    """A chart of several series sharing axes.

    Attributes:
        title: the chart's title.
        x_label: x-axis label.
        y_label: y-axis label.
        series: the lines.
        log_x: logarithmic x axis (base 2), e.g. for chunk or cache sizes.
        x_ticks: optional ``(value, label)`` tick marks on the x axis.
    """

    title: str
    x_label: str
    y_label: str
    series: tuple[Series, ...]
    log_x: bool = False
    x_ticks: tuple[tuple[float, str], ...] = ()


PANELS_PER_ROW = 4
"""Panels side by side before the next row starts (a wide row is unreadable once scaled down)."""


class PlotUnavailableError(RuntimeError):
    """matplotlib cannot be imported."""


def save_chart(charts: Sequence[Chart], path: Path) -> None:
    """Draw ``charts`` into one PNG file, side by side in rows of at most :data:`PANELS_PER_ROW`.

    Args:
        charts: one or more charts (one panel each).
        path: the PNG file to write.

    Raises:
        PlotUnavailableError: matplotlib is not installed.
        ValueError: no charts.
    """
    if not charts:
        raise ValueError("nothing to plot")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailableError(
            f"--plot needs matplotlib ({exc}); install it with: pip install 'tiercache[bench]'"
        ) from None
    cols = min(len(charts), PANELS_PER_ROW)
    rows = -(-len(charts) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.4 * cols, 4.8 * rows), squeeze=False)
    for ax in axes.flat[len(charts) :]:
        ax.set_visible(False)
    try:
        for ax, chart in zip(axes.flat, charts, strict=False):
            for s in chart.series:
                style = {"linestyle": "--" if s.dashed else "-", "marker": "o", "label": s.label}
                if not s.errors:
                    pts = sorted(s.points)
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], **style)
                    continue
                bars = sorted(zip(s.points, s.errors, strict=True))
                ys = [p[1] for p, _ in bars]
                below = [max(0.0, y - e[0]) for y, (_, e) in zip(ys, bars, strict=True)]
                above = [max(0.0, e[1] - y) for y, (_, e) in zip(ys, bars, strict=True)]
                ax.errorbar([p[0] for p, _ in bars], ys, yerr=[below, above], capsize=4, **style)
            if chart.log_x:
                ax.set_xscale("log", base=2)
            if chart.x_ticks:
                ax.set_xticks([t[0] for t in chart.x_ticks], [t[1] for t in chart.x_ticks])
                ax.minorticks_off()
            ax.set_title(chart.title)
            ax.set_xlabel(chart.x_label)
            ax.set_ylabel(chart.y_label)
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize="small")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    logger.info("plot written to %s", path)
