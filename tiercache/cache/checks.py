"""Argument checks of the cache facade: counts, durations and tier levels.

Each check returns the value it accepts, normalized (a default level resolved, seconds as ``float``), or
raises :class:`~tiercache.errors.InvalidArgumentError` naming the caller's field, so that a bad argument
fails before any part of the cache is touched. A bool is never taken for a number.

Primitives:
    count: a non-negative integer.
    seconds: a non-negative (or positive) number of seconds.
    lifetime: a requested lease / ticket / claim lifetime: the default when absent, refused above its cap.
    tier_level, slot_level: a tier of the cache (a slot tier, for loads), the fastest one by default.
    usage: an engine's usage report (non-negative token counts, per tier of the cache).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tiercache.errors import InvalidArgumentError
from tiercache.tiers.base import SlotTier, StorageTier, TierLevel


def count(value: object, field: str, message: str = "must be a non-negative integer") -> int:
    """``value`` when it is a non-negative ``int``; else InvalidArgumentError ``field: message, got ...``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgumentError(field, f"{message}, got {value!r}")
    return value


def seconds(value: object, field: str, positive: bool = False, message: str | None = None) -> float:
    """``value`` as a float when it is a number ``>= 0`` (``> 0`` when ``positive``); else
    InvalidArgumentError ``field: message, got ...`` (NaN is refused)."""
    if (
        not isinstance(value, bool)
        and isinstance(value, (int, float))
        and (value > 0 or (value == 0 and not positive))  # NaN fails both comparisons
    ):
        return float(value)
    bound = "a positive" if positive else "a non-negative"
    raise InvalidArgumentError(field, f"{message or f'must be {bound} number of seconds'}, got {value!r}")


def lifetime(value: object, default_s: float, max_s: float, field: str = "ttl_s") -> float:
    """A lifetime in seconds: ``default_s`` when ``value`` is None, else ``value`` as a positive float
    no greater than ``max_s``.

    A lifetime above the cap is refused (InvalidArgumentError naming ``field`` and the cap), not clamped:
    a caller that asked for more than it may have learns so at once, instead of losing its lease, ticket
    or claim earlier than it planned.
    """
    if value is None:
        return default_s
    ttl = seconds(value, field, positive=True)
    if ttl > max_s:
        raise InvalidArgumentError(field, f"must be at most max_ttl_s = {max_s:g} seconds, got {value!r}")
    return ttl


def tier_level(tiers: Mapping[TierLevel, StorageTier], level: TierLevel | None) -> TierLevel:
    """A level of ``tiers`` (ordered fastest first); None: the fastest."""
    if level is None:
        return next(iter(tiers))
    if not isinstance(level, TierLevel) or level not in tiers:
        raise InvalidArgumentError("level", f"{level!r} is not a tier of this cache ({list(tiers)})")
    return level


def slot_level(tiers: Mapping[TierLevel, StorageTier], level: TierLevel | None) -> TierLevel:
    """A slot tier's level of ``tiers`` (ordered fastest first); None: the fastest slot tier."""
    if level is None:
        slot_levels = [lv for lv, t in tiers.items() if isinstance(t, SlotTier)]
        if not slot_levels:
            raise InvalidArgumentError("level", "this cache has no slot tier (L1 or L2) to load from")
        return slot_levels[0]
    if not isinstance(tiers[tier_level(tiers, level)], SlotTier):
        raise InvalidArgumentError("level", f"{level.name} has no slots to lease; use L1 or L2")
    return level


def usage(
    effective_by_tier: Mapping[TierLevel, int],
    recomputed_tokens: int,
    levels: Iterable[TierLevel],
    loaded_by_tier: Mapping[TierLevel, int],
) -> None:
    """Refuse a usage report with a negative count or a tier not in ``levels`` (InvalidArgumentError naming
    ``recomputed_tokens``, ``effective_by_tier`` or ``loaded_by_tier``)."""
    count(recomputed_tokens, "recomputed_tokens")
    known = set(levels)
    for name, by_tier in (("effective_by_tier", effective_by_tier), ("loaded_by_tier", loaded_by_tier)):
        for level, tokens in by_tier.items():
            if level not in known:
                raise InvalidArgumentError(name, f"{level!r} is not a tier of this cache")
            count(tokens, name, "token counts must be non-negative")
