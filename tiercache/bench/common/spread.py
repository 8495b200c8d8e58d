"""Figures and ratios measured round by round, so that one glitch cannot decide them.

A ceiling measured once, before or after the figures, can land on a noisy moment of a shared machine (a
16 MiB memcpy once came out at 2 GB/s against 21 GB/s around it and printed an L2 ratio of 9.8). Here
every timed round of a figure is paired with a ceiling pass taken right before it, each pair gives a
ratio, and the median ratio is kept with the lowest and highest next to it. A figure measured in rounds
(seconds, GB/s) is kept the same way: its median round with the lowest and highest round next to it.

Primitives:
    Spread: median, lowest and highest of a figure over rounds, and the rounds.
    spread_of: the spread of one figure's rounds.
    RatioSpread: median, lowest and highest per-round ratio, and the rounds.
    paired_ratios: the spread of ``value[i] / ceiling[i]`` over rounds.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Spread:
    """One figure over rounds (seconds, GB/s, ...).

    Attributes:
        median: the median round (the figure of record; the mean of the middle two for an even count).
        low: the lowest round.
        high: the highest round.
        rounds: rounds measured.
    """

    median: float
    low: float
    high: float
    rounds: int

    def text(self, fmt: str = ".3f") -> str:
        """``0.067 (0.053-0.080)`` for ``fmt=".3f"``; the median alone for one round."""
        if self.rounds == 1:
            return format(self.median, fmt)
        return f"{self.median:{fmt}} ({self.low:{fmt}}-{self.high:{fmt}})"


def spread_of(values: Sequence[float]) -> Spread:
    """The median, lowest and highest of ``values`` (one per round).

    Raises:
        ValueError: no rounds.
    """
    if not values:
        raise ValueError("a spread needs at least one round")
    return Spread(statistics.median(values), min(values), max(values), len(values))


@dataclass(frozen=True, slots=True)
class RatioSpread:
    """Per-round ratios of a figure to its ceiling.

    Attributes:
        median: the median ratio (the figure of record).
        low: the lowest round's ratio.
        high: the highest round's ratio.
        rounds: rounds paired.
    """

    median: float
    low: float
    high: float
    rounds: int

    def text(self) -> str:
        """``0.83x (0.78-0.88, 5 rounds)``."""
        return f"{self.median:.2f}x ({self.low:.2f}-{self.high:.2f}, {self.rounds} rounds)"


def paired_ratios(values: Sequence[float], ceilings: Sequence[float]) -> RatioSpread:
    """The spread of ``values[i] / ceilings[i]`` (same unit, e.g. GB/s; higher is better for both).

    Raises:
        ValueError: no rounds, unequal lengths, or a ceiling that is not positive.
    """
    if not values or len(values) != len(ceilings):
        raise ValueError(f"need as many ceilings as values, at least one: {len(values)} vs {len(ceilings)}")
    if min(ceilings) <= 0:
        raise ValueError("every ceiling must be positive")
    s = spread_of([v / c for v, c in zip(values, ceilings, strict=True)])
    return RatioSpread(s.median, s.low, s.high, s.rounds)
