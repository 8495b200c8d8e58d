"""Token-weighted outcomes of the connector's loads and stores.

Primitives:
    LoadResult: what a load brought into the engine's tensors (and from which tiers).
    StoreResult: what a store added to the cache.
    usage_of: what a load result reports to the daemon (effective chunks per source tier, recomputed tokens;
        the loaded tokens per source tier are its ``sources``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from tiercache.tiers.base import TierLevel

_NO_SOURCES: Mapping[TierLevel, int] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class LoadResult:
    """Outcome of a load, in tokens.

    Attributes:
        tokens_looked_up: tokens in the full chunks of the prompt (what could have been loaded).
        tokens_hit: tokens of the cached prefix the daemon offered (leased) under the load policy.
        tokens_loaded: tokens whose KV arrived intact in the engine's tensors (the engine skips these).
        remote: True when the byte stream was used.
        tokens_cached: tokens of the prefix cached in any tier when the daemon looked (the policy may have
            offered fewer: not in time, or not worth loading).
        sources: of ``tokens_loaded``, tokens per source tier (the fastest tier that held each chunk).
        estimated_load_s: cost-aware loads: the daemon's estimate of the chosen prefix's load time.
        estimated_recompute_s: cost-aware loads: its estimate of recomputing that prefix instead.
    """

    tokens_looked_up: int
    tokens_hit: int
    tokens_loaded: int
    remote: bool = False
    tokens_cached: int = 0
    sources: Mapping[TierLevel, int] = field(default_factory=lambda: _NO_SOURCES)
    estimated_load_s: float = 0.0
    estimated_recompute_s: float = 0.0

    @property
    def tokens_recomputed(self) -> int:
        """Cached tokens the engine recomputes anyway (not offered, or not arrived)."""
        return max(0, max(self.tokens_cached, self.tokens_hit) - self.tokens_loaded)


@dataclass(frozen=True, slots=True)
class StoreResult:
    """Outcome of a store, in tokens.

    Attributes:
        tokens_offered: tokens in the full chunks of the prompt.
        tokens_stored: tokens of the chunks the daemon added.
        tokens_skipped: tokens of chunks already cached (or being stored by another engine).
        remote: True when the byte stream was used.
    """

    tokens_offered: int
    tokens_stored: int
    tokens_skipped: int
    remote: bool = False


def usage_of(result: LoadResult, chunk_tokens: int) -> tuple[dict[TierLevel, int], int]:
    """What to report for a load: effective chunks per source tier, and recomputed tokens."""
    chunks = {tier: tokens // chunk_tokens for tier, tokens in result.sources.items() if tokens > 0}
    return chunks, result.tokens_recomputed
