"""Connecting ahead: register the engine's namespace with the daemon at engine start, off the request path.

A client dials the daemon lazily, so without this the first request of a fresh engine pays for opening the
channel and registering its namespace in both roles (two Register round trips), and the worker also for
mapping the daemon's shared-memory segment. :func:`connect_ahead` does that work in a background thread
while vLLM is still starting; a request that arrives first simply does it itself (the client is
thread-safe and maps a segment once). A daemon that is down is logged, not raised: requests recompute
until it is back. Once the segment is mapped, another background thread maps its pages into this process
(:meth:`~..segments.SlotMapping.prefault`, at a lower CPU priority), so that a fresh engine's first loads do
not take a page fault per 4 KiB; it stops when the mapping is retired and is never waited for.

Primitives:
    connect_ahead: start the thread (register, and map the segment for the worker role).
"""

from __future__ import annotations

import logging
import threading

from tiercache.errors import TierCacheError
from tiercache.keys import Namespace
from tiercache.policies.load import PrefillModel
from tiercache.priority import lower_thread_priority

from ..client import TierCacheClient
from ..segments import SlotMapping

logger = logging.getLogger(__name__)

PREFAULT_NICE = 10
"""Nice increment of the thread that maps the segment in: it takes only CPU the engine leaves."""


def connect_ahead(
    client: TierCacheClient,
    namespace: Namespace,
    map_segment: bool,
    prefill: PrefillModel | None = None,
) -> threading.Thread:
    """Register ``namespace`` (declaring ``prefill`` first) and, with ``map_segment``, map its segment, in a
    background thread; returns the started thread (join it before closing the client)."""

    def run() -> None:
        if prefill is not None:
            client.declare_models(namespace, prefill)  # sent with this first registration
        try:
            if map_segment:
                mapping = client.slot_mapping(namespace)
                if mapping is not None:
                    threading.Thread(
                        target=_prefault, args=(mapping,), name="tiercache-prefault", daemon=True
                    ).start()
            else:
                client.registration(namespace)
        except TierCacheError as exc:
            logger.info(
                "tiercache daemon not reachable at engine start (%s); requests recompute meanwhile", exc
            )

    thread = threading.Thread(target=run, name="tiercache-vllm-connect", daemon=True)
    thread.start()
    return thread


def _prefault(mapping: SlotMapping) -> None:
    lower_thread_priority(PREFAULT_NICE, "prefault")
    mapped = mapping.prefault()
    logger.debug("mapped %d bytes of segment %s in ahead", mapped, mapping.name)
