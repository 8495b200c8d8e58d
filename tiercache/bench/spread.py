"""Ratios of figures to ceilings measured round by round, so that one glitch cannot decide a ratio.

A ceiling measured once, before or after the figures, can land on a noisy moment of a shared machine (a
16 MiB memcpy once came out at 2 GB/s against 21 GB/s around it and printed an L2 ratio of 9.8). Here
every timed round of a figure is paired with a ceiling pass taken right before it, each pair gives a
ratio, and the median ratio is kept with the lowest and highest next to it.

Primitives:
    RatioSpread: median, lowest and highest per-round ratio, and the rounds.
    paired_ratios: the spread of ``value[i] / ceiling[i]`` over rounds.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


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
    ratios = [v / c for v, c in zip(values, ceilings, strict=True)]
    return RatioSpread(statistics.median(ratios), min(ratios), max(ratios), len(ratios))
