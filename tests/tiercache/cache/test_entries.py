"""ChunkEntry's compact copies (one Residency, or a tuple of them) behave as a dict of copies by level would."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tiercache.cache.entries import ChunkEntry, Residency, tier_bit
from tiercache.tiers.base import TierLevel

L1, L2, L3, SHARED = TierLevel.L1, TierLevel.L2, TierLevel.L3, TierLevel.SHARED


def _entry() -> ChunkEntry:
    return ChunkEntry(b"n" * 16, b"n" * 16 + b"k" * 32, 0, 64)


def test_a_single_copy_is_held_without_a_container() -> None:
    entry = _entry()
    res = Residency(L3, 7, 0.0)
    entry.add_copy(res)
    assert entry.held is res and entry.tiers == tier_bit(L3)
    assert entry.copies() == (res,) and entry.levels == (L3,)
    assert entry.has_copy(L3) and not entry.has_copy(L1)
    assert entry.copy(L3) is res and entry.find_copy(L2) is None
    assert entry.fastest == entry.slowest == L3


def test_copies_are_kept_fastest_first_and_a_drop_back_to_one_unwraps() -> None:
    entry = _entry()
    low, high = Residency(L3, 1, 0.0), Residency(L1, 2, 0.0)
    entry.add_copy(low)
    entry.add_copy(high)
    assert entry.copies() == (high, low) and entry.levels == (L1, L3)
    assert (entry.fastest, entry.slowest) == (L1, L3)
    entry.drop_copy(L1)
    assert entry.held is low and entry.levels == (L3,)
    entry.drop_copy(L3)
    assert entry.copies() == () and entry.tiers == 0 and entry.levels == ()


def test_a_second_copy_of_one_level_replaces_the_first() -> None:
    entry = _entry()
    entry.add_copy(Residency(L2, 1, 0.0))
    entry.add_copy(Residency(L3, 1, 0.0))
    newer = Residency(L2, 5, 1.0)
    entry.add_copy(newer)
    assert entry.copy(L2) is newer and len(entry.copies()) == 2


def test_an_absent_copy_is_a_key_error_and_no_copy_has_no_fastest() -> None:
    entry = _entry()
    with pytest.raises(KeyError):
        entry.copy(L1)
    with pytest.raises(KeyError):
        entry.drop_copy(L1)
    with pytest.raises(IndexError):
        _ = entry.fastest


_OPS = st.lists(st.tuples(st.booleans(), st.sampled_from(list(TierLevel)), st.integers(0, 99)), max_size=30)


@given(_OPS)
def test_adds_and_drops_match_a_dict_of_copies(ops: list[tuple[bool, TierLevel, int]]) -> None:
    entry, model = _entry(), dict[TierLevel, Residency]()
    for add, level, tick in ops:
        if add:
            res = Residency(level, tick, 0.0)
            entry.add_copy(res)
            model[level] = res
        elif level in model:
            entry.drop_copy(level)
            del model[level]
        assert entry.levels == tuple(sorted(model))
        assert entry.copies() == tuple(model[lv] for lv in sorted(model))
        assert entry.tiers == sum(map(tier_bit, model))
        assert all(entry.copy(lv) is res for lv, res in model.items())
        assert all(entry.find_copy(lv) is None for lv in TierLevel if lv not in model)
        assert isinstance(entry.held, Residency) == (len(model) == 1)
