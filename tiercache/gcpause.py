"""Bulk construction without garbage-collector passes: a warm start builds millions of small objects at once.

CPython's cyclic collector runs every few hundred container allocations and, as the young objects survive,
walks the older generations again and again: building the index of a million chunks spends most of its
time in the collector, not in the work (three times the work itself, measured at a million L3 chunks). A
warm start's bulk build creates no reference cycles worth collecting, so the collector is paused for its
duration and restored afterwards.

Objects made while the collector is paused are all in its youngest generation when it resumes: its next
passes would walk the whole new index three times over (young, middle, old generation), each a stall of
seconds at a million chunks, in the first requests after a warm start. A large bulk build therefore ends
with one full collection, which moves the survivors to the oldest generation at once (walked again only
when the old generation has grown by a quarter).

Primitives:
    SETTLE_MIN_OBJECTS: the bulk size from which the build ends with a full collection.
    collector_paused: a context in which the cyclic garbage collector does not run.
    settle: one full collection after a bulk build of at least :data:`SETTLE_MIN_OBJECTS`.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

SETTLE_MIN_OBJECTS = 100_000
"""Objects (chunks, say) built in bulk from which :func:`settle` runs a full collection (below it the
collector's own passes cost little, and a full collection per cache built would slow small processes)."""


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


def settle(built: int) -> None:
    """Run one full collection when ``built`` (objects, or chunks, of a bulk build) reaches
    :data:`SETTLE_MIN_OBJECTS`; do nothing below it."""
    if built >= SETTLE_MIN_OBJECTS:
        gc.collect()
