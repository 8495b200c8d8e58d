"""The write policies' own rules, without a cache around them."""

from __future__ import annotations

import pytest

from tiercache.errors import InvalidArgumentError
from tiercache.policies import OnEvict, Selective, Watermark, WriteThrough, make_write_policy


def test_selective_writes_proven_chunks_down_only_when_evicted() -> None:
    p = make_write_policy("selective", selective_min_hits=2)
    assert isinstance(p, Selective)
    assert [p.on_hit(h) for h in range(5)] == [False] * 5  # a hit never writes: the upper copy serves
    assert [p.on_evict(h, pinned=False) for h in range(4)] == [False, False, True, True]
    assert (
        p.on_evict(0, pinned=True)
        and p.on_commit(pinned=True, fill=0.0)
        and not p.on_commit(pinned=False, fill=1.0)
    )


def test_write_through_and_on_evict() -> None:
    assert WriteThrough().on_commit(False, 0.0) and WriteThrough().on_evict(0, False)
    assert not OnEvict().on_commit(True, 1.0) and OnEvict().on_evict(0, False)


def test_watermark_writes_through_from_half_full_and_demotes_what_came_before() -> None:
    p = make_write_policy("watermark")
    assert isinstance(p, Watermark)
    assert [p.on_commit(False, f) for f in (0.0, 0.25, 0.49, 0.5, 0.9, 1.0)] == [False] * 3 + [True] * 3
    assert p.on_commit(True, 0.0)  # pinned: always through
    assert p.on_evict(0, False) and not p.on_hit(3)
    with pytest.raises(InvalidArgumentError, match="watermark_fill"):
        Watermark(1.5)


def test_selective_needs_a_positive_count() -> None:
    with pytest.raises(InvalidArgumentError, match="selective_min_hits"):
        Selective(0)
