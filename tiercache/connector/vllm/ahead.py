"""Connecting ahead: register the engine's namespace with the daemon at engine start, off the request path.

A client dials the daemon lazily, so without this the first request of a fresh engine pays for opening the
channel and registering its namespace in both roles (two Register round trips), and the worker also for
mapping the daemon's shared-memory segment. :func:`connect_ahead` does that work in a background thread
while vLLM is still starting; a request that arrives first simply does it itself (the client is
thread-safe and maps a segment once). A daemon that is down is logged, not raised: requests recompute
until it is back.

Primitives:
    connect_ahead: start the thread (register, and map the segment for the worker role).
"""

from __future__ import annotations

import logging
import threading

from tiercache.errors import TierCacheError
from tiercache.keys import Namespace
from tiercache.policies.load import PrefillModel

from ..client import TierCacheClient

logger = logging.getLogger(__name__)


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
                client.slot_mapping(namespace)
            else:
                client.registration(namespace)
        except TierCacheError as exc:
            logger.info(
                "tiercache daemon not reachable at engine start (%s); requests recompute meanwhile", exc
            )

    thread = threading.Thread(target=run, name="tiercache-vllm-connect", daemon=True)
    thread.start()
    return thread
