"""A test observer: ``TierCacheConnector`` whose commits wait until the test opens a gate.

With the gate closed a save stays in flight (copied, not committed) for as long as the test wants, so it can
finish a request meanwhile and watch vLLM hold its blocks. The commits themselves are the real ones, to the
real daemon. Imported by vLLM from this directory (on ``PYTHONPATH``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from tiercache.connector.vllm import TierCacheConnector
from tiercache.keys import Namespace


class GatedConnector(TierCacheConnector):
    """``gate``: commits wait for it; ``committed``: set after a commit returned; ``tickets``: committed ids."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()
        self.committed = threading.Event()
        self.tickets: list[int] = []
        commit = self.client.commit_store

        def gated(namespace: Namespace, ticket_id: int, indices: Sequence[int] | None = None) -> int:
            if not self.gate.wait(120.0):
                raise AssertionError("the test never opened the gate")
            added = commit(namespace, ticket_id, indices)
            self.tickets.append(ticket_id)
            self.committed.set()
            return added

        self.client.commit_store = gated  # type: ignore[method-assign]
