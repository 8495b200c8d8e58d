"""Tests of figures over rounds and per-round ratios to interleaved ceilings."""

from __future__ import annotations

import pytest

from tiercache.bench.common.spread import Spread, paired_ratios, spread_of


def test_one_slow_ceiling_pass_moves_the_median_not_the_figure() -> None:
    spread = paired_ratios([8.0, 8.0, 8.0, 8.0, 8.0], [10.0, 10.0, 1.0, 10.0, 10.0])
    assert spread.median == pytest.approx(0.8) and spread.low == pytest.approx(0.8)
    assert spread.high == pytest.approx(8.0) and spread.rounds == 5
    assert spread.text() == "0.80x (0.80-8.00, 5 rounds)"


@pytest.mark.parametrize(("values", "ceilings"), [([], []), ([1.0], [1.0, 2.0]), ([1.0], [0.0])])
def test_bad_pairs_are_refused(values: list[float], ceilings: list[float]) -> None:
    with pytest.raises(ValueError):
        paired_ratios(values, ceilings)


def test_one_slow_round_moves_the_high_end_not_the_median() -> None:
    spread = spread_of([0.05, 0.04, 0.30, 0.06, 0.05])
    assert spread == Spread(0.05, 0.04, 0.30, 5)
    assert spread.text() == "0.050 (0.040-0.300)" and spread.text(".2f") == "0.05 (0.04-0.30)"


def test_an_even_count_takes_the_middle_two_and_one_round_prints_alone() -> None:
    assert spread_of([4.0, 1.0, 2.0, 3.0]).median == pytest.approx(2.5)
    assert spread_of([0.25]).text() == "0.250"


def test_no_rounds_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one round"):
        spread_of([])
