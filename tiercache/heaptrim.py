"""Giving the C heap's free pages back to the system after a bulk build.

A warm start over a million chunks allocates and frees hundreds of megabytes of temporaries (column lists
and numpy arrays of the L3 scan and of the index build) between allocations that stay (the index's tables).
glibc's allocator gives a freed block back to the system only when it lies at the top of its heap or was
mapped on its own, and its mapping threshold rises with the first large block freed: most of the
temporaries end up in the heap, under the tables that stay, and stay resident (91 bytes per chunk of a
million-chunk warm start, 14 % of the anonymous memory it grew by). ``malloc_trim(0)`` hands every free
page of the heap back (5 ms at a million chunks); the memory is reused as before when the process needs it.
Where the C library is not glibc, nothing is done.

Primitives:
    release_free_heap: hand the C heap's free pages back to the system; whether it could.
"""

from __future__ import annotations

import ctypes
import logging

logger = logging.getLogger(__name__)


def release_free_heap() -> bool:
    """Hand the free pages of the C heap back to the system (glibc's ``malloc_trim(0)``).

    Returns:
        True when glibc did it; False where the C library has no ``malloc_trim``.
    """
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        logger.debug("no malloc_trim in this process's C library; free heap pages stay")
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    trim(0)
    return True
