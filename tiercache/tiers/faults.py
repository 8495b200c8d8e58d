"""Read fault injection for deadline tests: a tier's reads made slower on purpose (off by default).

A slow disk cannot be ordered on demand, but the load policies' deadlines and the connector's fallback to
recompute have to be tested against one. A tier configured with read faults sleeps after each read call
for a fixed delay plus the time its bytes would take at a throttled rate. This is injected latency, not
synchronisation: nothing waits on it.

Primitives:
    ReadFaults: the delay and the throttle, validated; ``delay_s(nbytes)`` and ``inject(nbytes)``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tiercache.errors import InvalidArgumentError


@dataclass(frozen=True, slots=True)
class ReadFaults:
    """Extra latency of every read call.

    Attributes:
        delay_s: seconds added to every read call (0 for none).
        bytes_per_s: reads are throttled to this many stored bytes per second (0 for no throttle).

    Errors name the tier config fields these come from (``fault_read_delay_s``, ``fault_read_bytes_per_s``).
    """

    delay_s: float = 0.0
    bytes_per_s: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.delay_s, bool) or not self.delay_s >= 0:
            raise InvalidArgumentError("fault_read_delay_s", f"must be >= 0, got {self.delay_s!r}")
        rate = self.bytes_per_s
        if not isinstance(rate, int) or isinstance(rate, bool) or rate < 0:
            raise InvalidArgumentError(
                "fault_read_bytes_per_s", f"must be a non-negative integer, got {rate!r}"
            )

    def delay_for(self, nbytes: int) -> float:
        """Seconds a read call of ``nbytes`` stored bytes is slowed down by."""
        delay = self.delay_s
        if self.bytes_per_s:
            delay += nbytes / self.bytes_per_s
        return delay

    def inject(self, nbytes: int) -> None:
        """Sleep for :meth:`delay_for` ``nbytes`` (returns at once when faults are off)."""
        delay = self.delay_for(nbytes)
        if delay > 0:
            time.sleep(delay)
