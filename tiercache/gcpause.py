"""Bulk construction without garbage-collector passes: a warm start builds millions of small objects at once.

CPython's cyclic collector runs every few hundred container allocations and, as the young objects survive,
walks the older generations again and again: building the index of a million chunks spends most of its
time in the collector, not in the work (three times the work itself, measured at a million L3 chunks). A
warm start's bulk build creates no reference cycles worth collecting, so the collector is paused for its
duration and restored afterwards.

Objects made while the collector is paused are all in its youngest generation when it resumes: its next
passes would walk the whole new index three times over (young, middle, old generation), each a stall of
seconds at a million chunks, in the first requests after a warm start. One full collection at the end of
the build would walk it once (2.4 s of a 7 s warm start over a million L3 chunks), and every later full
collection would walk it again. A large bulk build therefore ends by moving every object the collector
tracks into its permanent generation (:func:`gc.freeze`: a splice of its lists, no walk), where no later
collection looks: the index's entries hold no reference cycles, reference counting frees them when they go.
What a cycle among the frozen objects holds (a closed cache's object graph) is freed only once they are
thawed (:func:`thaw`, which the cache calls when it closes: they go back to the oldest generation, walked by
the next full collection as any other object).

A long-running process (the daemon) does the same once it has started: its imports (torch, grpc, numpy)
and start-up state are some 200,000 tracked objects that live as long as it does, and each full collection
walked them all again: a stall of ~100 ms inside whichever request allocated at that moment (seen on a
2-core host as one 512-chunk BeginStore or CommitStore in five taking 110-145 ms instead of 5-30 ms).
:func:`settle_started` collects once, then freezes them.

Primitives:
    SETTLE_MIN_OBJECTS: the bulk size from which the build ends frozen.
    collector_paused: a context in which the cyclic garbage collector does not run.
    settle: freeze what the collector tracks after a bulk build of at least :data:`SETTLE_MIN_OBJECTS`.
    settle_started: collect, then freeze what the collector tracks, once a long-running process started.
    thaw: give the frozen objects back to the collector.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

SETTLE_MIN_OBJECTS = 100_000
"""Objects (chunks, say) built in bulk from which :func:`settle` freezes them (below it the collector's own
passes cost little, and small processes keep the collector's ordinary behaviour)."""


@contextmanager
def collector_paused() -> Iterator[None]:
    """Disable the cyclic garbage collector inside the context; enabled again after if it was before.

    Reference counting still frees what becomes unreachable; only cycles wait for the next collection.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def settle(built: int) -> bool:
    """After a bulk build of ``built`` objects (or chunks): from :data:`SETTLE_MIN_OBJECTS` on, move every
    object the collector tracks into its permanent generation (no walk; see the module docstring) and
    return True; below it do nothing and return False."""
    if built < SETTLE_MIN_OBJECTS:
        return False
    gc.freeze()
    return True


def settle_started() -> int:
    """Once a long-running process has started: collect what is already garbage, then freeze every object
    the collector still tracks (see the module docstring), so that later full collections walk only what
    came after. Returns the objects now frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def thaw() -> None:
    """Give every frozen object back to the collector (its oldest generation): cycles among them, such as
    those of a closed cache, can be collected again."""
    gc.unfreeze()
