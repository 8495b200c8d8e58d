"""Run-time estimates of how fast each tier delivers chunks.

Every timed read the cache manager makes (a promotion out of a tier, a copy out of a slot) is one sample
``(bytes, seconds)``. Per tier, a least-squares fit with exponential forgetting of ``seconds = latency +
bytes / bandwidth`` over recent samples gives the latency and bandwidth that load-time estimates use.
Until a tier has samples of two different sizes its latency is the prior and only the bandwidth is fitted;
before any sample the priors are used.

Primitives:
    TierRate: latency and bandwidth of one tier, and how many samples they rest on.
    RateEstimator: observe(level, nbytes, seconds), rate(level), load_seconds(level, nbytes).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass

from tiercache.errors import InvalidArgumentError
from tiercache.tiers.base import TierLevel


@dataclass(frozen=True, slots=True)
class TierRate:
    """How fast a tier delivers a chunk.

    Attributes:
        latency_s: fixed cost of one read.
        bytes_per_s: bandwidth after the fixed cost.
        samples: reads the estimate rests on (0: the prior).
    """

    latency_s: float
    bytes_per_s: float
    samples: int

    def seconds(self, nbytes: int) -> float:
        """Estimated time to read ``nbytes`` in one read."""
        return self.latency_s + nbytes / self.bytes_per_s


DEFAULT_PRIORS: Mapping[TierLevel, TierRate] = {
    TierLevel.L1: TierRate(20e-6, 10e9, 0),
    TierLevel.L2: TierRate(20e-6, 8e9, 0),
    TierLevel.L3: TierRate(200e-6, 1e9, 0),
    TierLevel.SHARED: TierRate(500e-6, 0.5e9, 0),
}
"""Conservative starting points, replaced as soon as a tier has been measured."""


@dataclass(slots=True)
class _Fit:
    w: float = 0.0
    x: float = 0.0
    y: float = 0.0
    xx: float = 0.0
    xy: float = 0.0
    n: int = 0


class RateEstimator:
    """Per-tier latency/bandwidth fits. Thread-safe."""

    def __init__(self, priors: Mapping[TierLevel, TierRate] = DEFAULT_PRIORS, decay: float = 0.95) -> None:
        """Args:
        priors: the rate of each tier before it has been measured.
        decay: weight kept by older samples at each new one (0 < decay < 1); 0.95 ~ the last 20 reads.
        """
        if not 0 < decay < 1:
            raise InvalidArgumentError("decay", f"must be in (0, 1), got {decay!r}")
        self._priors = dict(priors)
        self._decay = decay
        self._fits: dict[TierLevel, _Fit] = {}
        self._lock = threading.Lock()

    def observe(self, level: TierLevel, nbytes: int, seconds: float) -> None:
        """Record one read of ``nbytes`` that took ``seconds``."""
        if nbytes <= 0 or not seconds > 0:
            return
        with self._lock:
            f = self._fits.setdefault(level, _Fit())
            d = self._decay
            f.w, f.x, f.y = f.w * d + 1, f.x * d + nbytes, f.y * d + seconds
            f.xx, f.xy = f.xx * d + nbytes * nbytes, f.xy * d + nbytes * seconds
            f.n += 1

    def rate(self, level: TierLevel) -> TierRate:
        """The current estimate for a tier (its prior until measured)."""
        prior = self._priors.get(level, DEFAULT_PRIORS[TierLevel.L3])
        with self._lock:
            f = self._fits.get(level)
            if f is None or f.n == 0:
                return prior
            var = f.w * f.xx - f.x * f.x
            if var > 1e-9 * f.x * f.x:
                slope = (f.w * f.xy - f.x * f.y) / var
                latency = (f.y - slope * f.x) / f.w
                if slope > 0 and latency >= 0:
                    return TierRate(latency, 1.0 / slope, f.n)
            # One read size only (or a degenerate fit): keep the prior latency, fit the bandwidth.
            transfer = f.y - prior.latency_s * f.w
            if transfer <= 0:
                return TierRate(f.y / f.w, float("inf"), f.n)
            return TierRate(prior.latency_s, f.x / transfer, f.n)

    def load_seconds(self, level: TierLevel, nbytes: int) -> float:
        """Estimated time to read ``nbytes`` from a tier in one read."""
        return self.rate(level).seconds(nbytes)
