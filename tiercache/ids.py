"""Unguessable ids for what the daemon hands out: leases, store tickets, prefill claims, prefetches.

An id another tenant could predict tells it how busy the cache is (sequential ids count every tenant's
work) and gives it a target to probe. Each id is drawn from :mod:`secrets`: 63 random bits (it stays a
positive signed 64-bit integer, and fits the wire's uint64), never 0 (0 means "none" on the wire), and
never one still in use (``taken``), so that two live ids never collide however unlikely that is.

Primitives:
    ID_BITS: the bits of an id.
    fresh_id: a random non-zero id that ``taken`` does not claim.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

ID_BITS = 63
"""Random bits per id."""


def fresh_id(taken: Callable[[int], bool] = lambda _i: False) -> int:
    """A random id in ``1 .. 2**63 - 1`` for which ``taken`` is False (``taken``: whether an id is live)."""
    while True:
        ident = secrets.randbits(ID_BITS)
        if ident and not taken(ident):
            return ident
