"""The shared chart writer: many panels wrap into rows that stay readable; no charts is an error."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiercache.bench.common.plot import PANELS_PER_ROW, Chart, Series, save_chart

pytest.importorskip("matplotlib")


def _size(path: Path) -> tuple[int, int]:
    from matplotlib import image

    height, width = image.imread(str(path)).shape[:2]
    return int(width), int(height)


def test_many_panels_wrap_into_rows(tmp_path: Path) -> None:
    chart = Chart("t", "x", "y", (Series("a", ((1.0, 2.0), (2.0, 3.0))),))
    one, many = tmp_path / "one.png", tmp_path / "many.png"
    save_chart([chart], one)
    save_chart([chart] * (2 * PANELS_PER_ROW + 1), many)
    (w1, h1), (w, h) = _size(one), _size(many)
    assert w == pytest.approx(PANELS_PER_ROW * w1, rel=0.05)  # never wider than one row
    assert h == pytest.approx(3 * h1, rel=0.05)  # three rows, the last one with a single panel


def test_no_charts_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nothing to plot"):
        save_chart([], tmp_path / "none.png")
