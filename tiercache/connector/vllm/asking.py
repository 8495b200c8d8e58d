"""The scheduler side's daemon calls, made in background threads so that vLLM's scheduler never waits long.

:class:`Asker` takes one batch of questions (per namespace, each request's chunk keys and the first chunk
vLLM lacks) and makes one daemon call per namespace in one of its threads (``tiercache-ask``, up to
:data:`ASK_THREADS` batches at once, so that a batch whose answer waits for promotions from L3 does not hold
up the next steps' batches behind it): with TP = PP = 1 and
shared memory to lease in, one AcquireLoad carrying a chain per request (``more_chains``) under the
configured load policy; otherwise a Lookup per request that starts promoting its prefix. The answer per
namespace is the requests' leases, their cached chunks, or the error (a miss for every request of it). The
scheduler (:mod:`.scheduler`) decides how long to wait for it, helped by :class:`Outlook`: after a run of
answers that brought nothing (a working set that fits vLLM's own cache: every new prompt's next chunk is
new), a step with requests running does not wait at all for an answer that is not there yet: the request
computes its prompt, as it would have, unless it asks about a chunk this engine saved itself (a follow-up
turn). The answers still come and are still noted, so a hit ends the run.

After a namespace's first AcquireLoad the Asker keeps the pool it leased from (mapped by the client), whose
published L2 index (:meth:`Asker.published`) lets the scheduler answer a request with no call at all.

Primitives:
    ASK_THREADS: batches asked at once.
    MISS_RUN: answers without a hit after which a busy step stops waiting.
    Answer: a namespace's answer.
    SAVED_KEYS: how many of its own saved chunks the Outlook remembers.
    Outlook: note, saved, hopeful.
    Asker: submit, published, leases, shutdown.
"""

from __future__ import annotations

import collections
import concurrent.futures
from collections.abc import Iterable, Sequence
from dataclasses import replace

from tiercache.errors import TierCacheError
from tiercache.keys import Namespace
from tiercache.policies.load import LoadPolicyKind
from tiercache.tiers.published import Published

from ..client import TierCacheClient
from ..dataplane import Medium
from ..handlers import daemon_medium
from ..results import LoadLease
from ..segments import SlotMapping
from .config import VllmConnectorConfig

ASK_THREADS = 4
"""Batches asked at once. With one thread, under ``vllm serve`` with L3 serving (docqa outgrowing, c=8) an
AcquireLoad promoting a prompt's chunks took 13-15 ms (median; p90 32-100 ms) and the batches of the next
steps queued behind it: p90 of the wait for the thread 5-48 ms, p99 20-134 ms; with 4, 1.2 ms and 3.4 ms."""

MISS_RUN = 16
"""Answers in a row that offered vLLM nothing, after which a step with requests running does not wait for a
late answer (measured under ``vllm serve``, chat fitting the engine's cache at concurrency 8: the step waited
1.4 ms (median) for each lookup while the running requests waited with it, and 10 % of them came after the
2 ms bound and cost their request a step)."""

SAVED_KEYS = 16384
"""How many of the chunks this engine saved the Outlook remembers (32-byte keys: ~2 MiB with the dict)."""

Answer = list[LoadLease] | list[int] | TierCacheError
"""A namespace's answer: its requests' leases (AcquireLoad), their cached chunks (Lookups), or the error."""

Question = tuple[Sequence[bytes], int]
"""A request's chunk keys, and the first chunk the daemon is asked about (vLLM has those before it)."""


class Outlook:
    """Whether a request's answer is worth waiting for in a busy step: while the daemon's answers bring
    hits (fewer than :data:`MISS_RUN` misses in a row), or when the first chunk it asks about is one this
    engine saved itself (a follow-up turn of a conversation; the last :data:`SAVED_KEYS` chunks kept)."""

    def __init__(self) -> None:
        self._misses = 0  # answers in a row without a hit
        self._saved: collections.OrderedDict[bytes, None] = collections.OrderedDict()

    def note(self, hit: bool) -> None:
        """Count one request's answer."""
        self._misses = 0 if hit else self._misses + 1

    def saved(self, keys: Iterable[bytes]) -> None:
        """Remember chunks this engine is saving."""
        for key in keys:
            self._saved[key] = None
            self._saved.move_to_end(key)
        while len(self._saved) > SAVED_KEYS:
            self._saved.popitem(last=False)

    def hopeful(self, first_key: bytes) -> bool:
        """Whether a busy step waits for the answer of a request that asks from ``first_key`` on."""
        return self._misses < MISS_RUN or first_key in self._saved


class Asker:
    """Makes the scheduler's daemon calls in background threads (see the module docstring)."""

    def __init__(self, client: TierCacheClient, config: VllmConnectorConfig, lease_here: bool) -> None:
        """Args:
        client: the scheduler's daemon client (thread-safe).
        config: the connector's config (load policy, timeout, prefill model, data plane).
        lease_here: TP = PP = 1: the scheduler leases for the worker.
        """
        self._client = client
        self._config = config
        self._lease_here = lease_here
        self._timeout_s = config.timeout_s if config.load_policy is LoadPolicyKind.TIMEOUT else 0.0
        self._threads = concurrent.futures.ThreadPoolExecutor(ASK_THREADS, thread_name_prefix="tiercache-ask")
        self._mappings: dict[Namespace, SlotMapping] = {}  # the pool each namespace last leased from

    def submit(
        self, questions: dict[Namespace, list[Question]]
    ) -> concurrent.futures.Future[dict[Namespace, Answer]]:
        """Ask the daemon in the background: one call per namespace."""
        return self._threads.submit(self._call, questions)

    def shutdown(self) -> None:
        """Finish the calls submitted, then stop the threads."""
        self._threads.shutdown(wait=True)

    def published(self, ns: Namespace, keys: Sequence[bytes], nbytes: int) -> tuple[str, list[Published]]:
        """The chunks of ``keys`` (from the first on, in order) that ``ns``'s pool publishes as held in L2
        now, and the pool's segment; none before a call of this namespace mapped its pool (and leased from
        it), or when the daemon publishes no index."""
        mapping = self._mappings.get(ns)
        index = None if mapping is None else mapping.index
        if mapping is None or index is None:
            return "", []
        return mapping.name, index.prefix(keys, nbytes)

    def leases(self, ns: Namespace) -> bool:
        """Whether the lookup leases the prefix for the worker (TP = PP = 1 and shared memory to lease in)."""
        if not self._lease_here:
            return False

        def offered() -> bool:  # asked under auto only
            return self._client.registration(ns).segment is not None

        return daemon_medium(self._config.data_plane, offered) is Medium.SHARED_MEMORY

    def _map(self, ns: Namespace) -> None:
        """Keep the pool ``ns`` leases from, for its index (the client maps it once; after a daemon restart
        the new one)."""
        if self._config.published_index:
            mapping = self._client.slot_mapping(ns)
            if mapping is not None:
                self._mappings[ns] = mapping
            else:
                self._mappings.pop(ns, None)

    def _call(self, questions: dict[Namespace, list[Question]]) -> dict[Namespace, Answer]:
        answers: dict[Namespace, Answer] = {}
        for ns, asked in questions.items():
            try:
                if self.leases(ns):
                    if self._config.prefill is not None:  # sent with the first registration
                        self._client.declare_models(ns, self._config.prefill)
                    chains = [keys[first:] for keys, first in asked]
                    lease = self._client.acquire_load(
                        ns,
                        chains[0],
                        policy=self._config.load_policy,
                        timeout_s=self._timeout_s,
                        more_chains=chains[1:],
                    )
                    answers[ns] = [
                        replace(lease, more=()),
                        *lease.more,
                    ]  # (a daemon without more_chains: none)
                    self._map(ns)
                else:
                    answers[ns] = [self._client.lookup(ns, keys, prefetch=True).chunks for keys, _ in asked]
            except TierCacheError as exc:
                answers[ns] = exc
        return answers
