"""Tests of per-round ratios to interleaved ceilings."""

from __future__ import annotations

import pytest

from tiercache.bench.spread import paired_ratios


def test_one_slow_ceiling_pass_moves_the_median_not_the_figure() -> None:
    spread = paired_ratios([8.0, 8.0, 8.0, 8.0, 8.0], [10.0, 10.0, 1.0, 10.0, 10.0])
    assert spread.median == pytest.approx(0.8) and spread.low == pytest.approx(0.8)
    assert spread.high == pytest.approx(8.0) and spread.rounds == 5
    assert spread.text() == "0.80x (0.80-8.00, 5 rounds)"


@pytest.mark.parametrize(("values", "ceilings"), [([], []), ([1.0], [1.0, 2.0]), ([1.0], [0.0])])
def test_bad_pairs_are_refused(values: list[float], ceilings: list[float]) -> None:
    with pytest.raises(ValueError):
        paired_ratios(values, ceilings)
