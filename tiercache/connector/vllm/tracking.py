"""What the scheduler side (:mod:`.scheduler`) tracks of each request, and of each daemon call in flight.

Primitives:
    Tracked: one request: its chunks, its answer (lease, loadable tokens), its load and save progress.
    Ask: what one request asks the daemon (its chunk keys from a position on).
    Call: a batch of asks in flight (one daemon call per namespace, made in the ask thread).
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field
from typing import Any

from tiercache.keys import Namespace
from tiercache.tiers.published import Published

from ..results import LoadLease
from .asking import Answer
from .params import RequestParams


@dataclass
class Tracked:
    """What the scheduler side tracks of one request."""

    request: Any
    adapter: str
    salt: str
    params: RequestParams
    full_chunks: int
    cached_chunks: int
    loadable_tokens: int = 0
    asked_from: int = -1  # the first chunk the daemon was asked about; -1: not asked
    pending_load: tuple[int, int] | None = None
    block_ids: list[int] = field(default_factory=list)
    saved_upto: int = 0
    save_open: bool = False
    save_done: bool = False
    namespace: Namespace | None = None
    lease: LoadLease | None = None
    asked_at: float = 0.0  # the clock just before the daemon was asked (a lease's TTL starts after)
    keys: list[bytes] | None = None  # the prompt's full chunks' keys, once computed
    published: tuple[Published, ...] = ()  # found in the pool's index, from chunk ``asked_from`` on
    segment: str = ""  # the pool's segment those were found in
    offered: bool = False  # the published answer was given to vLLM (a retry looks again)


@dataclass
class Ask:
    """What one request asks the daemon: its chunk keys from position ``first`` on."""

    tracked: Tracked
    namespace: Namespace
    keys: list[bytes]
    first: int
    most: int  # the most tokens vLLM could take from tiercache
    num_computed: int  # the tokens vLLM has


@dataclass(eq=False)  # one call is itself only (compared by identity in the in-flight list)
class Call:
    """A batch of asks in flight: one daemon call per namespace, made in the ask thread."""

    asks: dict[Namespace, list[Ask]]
    future: concurrent.futures.Future[dict[Namespace, Answer]]
