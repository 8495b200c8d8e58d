"""Free runs of pages: best fit, merging of neighbours, and the books checked against a page-by-page model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiercache.tiers.runs import FreeRuns


def test_take_is_best_fit_and_lowest_among_equals() -> None:
    runs = FreeRuns(20, True)
    assert [runs.take(n) for n in (3, 3, 3, 3)] == [0, 3, 6, 9]
    runs.give(3, 3)  # a hole of 3 at 3, and the 8 pages from 12
    runs.give(9, 3)  # ... which merges with them: [9, 20)
    assert runs.runs() == [(3, 3), (9, 11)]
    assert runs.take(2) == 3  # the shortest run that fits, not the first long one
    assert runs.take(4) == 9
    assert runs.take(8) is None and runs.largest() == 7 and runs.total == 8


def test_a_run_given_back_merges_on_both_sides() -> None:
    runs = FreeRuns(9, True)
    a, b, c = runs.take(3), runs.take(3), runs.take(3)
    assert (a, b, c) == (0, 3, 6) and runs.total == 0 and runs.take(1) is None
    runs.give(a, 3)
    runs.give(c, 3)
    assert runs.runs() == [(0, 3), (6, 3)] and runs.take(6) is None
    runs.give(b, 3)
    assert runs.runs() == [(0, 9)] and runs.take(9) == 0


def test_take_any_splits_the_longest_run() -> None:
    runs = FreeRuns(10, True)
    runs.take(2)
    assert runs.take_any(3) == (2, 3)
    assert runs.runs() == [(5, 5)]
    assert runs.take_any(99) == (5, 5) and runs.take_any(1) is None


def test_bad_gives_are_refused() -> None:
    runs = FreeRuns(8, False)
    runs.give(2, 2)
    with pytest.raises(ValueError):
        runs.give(2, 1)  # starts a free run
    with pytest.raises(ValueError):
        runs.give(7, 2)  # past the end
    with pytest.raises(ValueError):
        runs.give(0, 0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 12)), max_size=80))
def test_runs_agree_with_a_page_by_page_model(ops: list[tuple[bool, int]]) -> None:
    num_pages = 64
    runs = FreeRuns(num_pages, True)
    free = [True] * num_pages
    taken: list[tuple[int, int]] = []
    for take, n in ops:
        if take or not taken:
            start = runs.take(n)
            fits = [s for s in range(num_pages - n + 1) if all(free[s : s + n])]
            assert (start is None) == (not fits)
            if start is not None:
                assert all(free[start : start + n])
                free[start : start + n] = [False] * n
                taken.append((start, n))
        else:
            start, count = taken.pop(n % len(taken))
            runs.give(start, count)
            free[start : start + count] = [True] * count
        assert runs.total == sum(free)
        model = []  # maximal free runs of the model
        for page, is_free in enumerate(free):
            if is_free and (page == 0 or not free[page - 1]):
                model.append([page, 0])
            if is_free:
                model[-1][1] += 1
        assert runs.runs() == [tuple(r) for r in model]
        assert runs.largest() == max((r[1] for r in model), default=0)
