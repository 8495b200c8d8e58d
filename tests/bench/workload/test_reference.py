"""Tests of the reference caches: MIN is the optimum (checked against exhaustive search), LRU is plain LRU."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiercache.bench.workload.reference import ReferenceKind, reference_hit_chunks


def _prefix_keys(paths: Sequence[Sequence[int]]) -> list[list[bytes]]:
    """Requests as prefix keys: request ``[3, 1]`` holds chunks ``b"3"`` and ``b"3.1"``."""
    return [[".".join(map(str, p[: i + 1])).encode() for i in range(len(p))] for p in paths]


def _optimum(requests: Sequence[Sequence[bytes]], capacity: int) -> int:
    """The most chunks any cache of ``capacity`` chunks can hit, by trying every choice of what to keep."""

    @functools.cache
    def best(r: int, cached: frozenset[bytes]) -> int:
        if r == len(requests):
            return 0
        keys = requests[r]
        hits = next((i for i, k in enumerate(keys) if k not in cached), len(keys))
        pool = sorted(cached | set(keys))
        keep = min(capacity, len(pool))
        return hits + max(best(r + 1, frozenset(c)) for c in itertools.combinations(pool, keep))

    return best(0, frozenset())


paths = st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=3), min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(paths, st.integers(0, 4))
def test_min_equals_the_exhaustive_optimum_and_bounds_lru(trace: list[list[int]], capacity: int) -> None:
    requests = _prefix_keys(trace)
    best = reference_hit_chunks(requests, capacity, ReferenceKind.MIN)
    assert best == _optimum(requests, capacity)
    assert best >= reference_hit_chunks(requests, capacity, ReferenceKind.LRU)


def test_lru_evicts_a_prompts_first_chunk_and_never_hits_again() -> None:
    requests = _prefix_keys([[1, 2, 3]] * 5)
    assert reference_hit_chunks(requests, 2, ReferenceKind.LRU) == 0
    assert reference_hit_chunks(requests, 2, ReferenceKind.MIN) == 2 * 4
    assert reference_hit_chunks(requests, 3, ReferenceKind.LRU) == 3 * 4


def test_min_keeps_the_chunk_used_soonest() -> None:
    # a, b, a, c, a, b with room for two: MIN keeps a throughout and gives up c (never used again).
    requests = [[b"a"], [b"b"], [b"a"], [b"c"], [b"a"], [b"b"]]
    assert reference_hit_chunks(requests, 2, ReferenceKind.MIN) == 3
    assert reference_hit_chunks(requests, 2, ReferenceKind.LRU) == 2


def test_zero_capacity_hits_nothing_and_negative_is_refused() -> None:
    requests = _prefix_keys([[1], [1]])
    assert reference_hit_chunks(requests, 0, ReferenceKind.MIN) == 0
    with pytest.raises(ValueError, match="capacity_chunks"):
        reference_hit_chunks(requests, -1, ReferenceKind.LRU)
