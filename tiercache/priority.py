"""Lower a background thread's CPU priority, so that it takes only CPU the serving threads leave.

Work off a request's path (the engine's save copies, the daemon's write-downs to slower tiers) still
competes for cores with the engine's forward passes; on a host with few cores, vLLM's engine and worker
busy-poll on every core, and whatever the background threads take comes out of the next step. Linux applies
a nice value per thread (``setpriority`` on the thread's native id), so such a thread can yield to the
serving threads of its own and other processes while it still runs at full speed on an idle host.

Primitives:
    lower_thread_priority: raise the calling thread's nice value.
"""

from __future__ import annotations

import logging
import os
import threading

logger = logging.getLogger(__name__)


def lower_thread_priority(increment: int, what: str) -> None:
    """Raise the calling thread's nice value by ``increment`` (where the OS supports it per thread).

    Args:
        increment: the nice increment (positive: lower priority).
        what: the thread's role, for the log line when the OS refuses.
    """
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + increment)
    except (AttributeError, OSError) as exc:  # not Linux, or not allowed: it runs at normal priority
        logger.debug("cannot lower the %s thread's priority (%s)", what, exc)
