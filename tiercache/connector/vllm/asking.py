"""The scheduler side's daemon calls, made in a background thread so that vLLM's scheduler never waits long.

:class:`Asker` takes one batch of questions (per namespace, each request's chunk keys and the first chunk
vLLM lacks) and makes one daemon call per namespace in its thread (``tiercache-ask``): with TP = PP = 1 and
shared memory to lease in, one AcquireLoad carrying a chain per request (``more_chains``) under the
configured load policy; otherwise a Lookup per request that starts promoting its prefix. The answer per
namespace is the requests' leases, their cached chunks, or the error (a miss for every request of it). The
scheduler (:mod:`.scheduler`) decides how long to wait for it, helped by :class:`Outlook`: after a run of
answers that brought nothing (a working set that fits vLLM's own cache: every new prompt's next chunk is
new), a step with requests running does not wait at all for an answer that is not there yet: the request
computes its prompt, as it would have. The answers still come and are still noted, so a hit ends the run.

Primitives:
    MISS_RUN: answers without a hit after which a busy step stops waiting.
    Answer: a namespace's answer.
    Outlook: note, expect_miss.
    Asker: submit, leases, shutdown.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence
from dataclasses import replace

from tiercache.errors import TierCacheError
from tiercache.keys import Namespace
from tiercache.policies.load import LoadPolicyKind

from ..client import TierCacheClient
from ..dataplane import Medium
from ..handlers import daemon_medium
from ..results import LoadLease
from .config import VllmConnectorConfig

MISS_RUN = 16
"""Answers in a row that offered vLLM nothing, after which a step with requests running does not wait for a
late answer (measured under ``vllm serve``, chat fitting the engine's cache at concurrency 8: the step waited
1.4 ms (median) for each lookup while the running requests waited with it, and 10 % of them came after the
2 ms bound and cost their request a step)."""

Answer = list[LoadLease] | list[int] | TierCacheError
"""A namespace's answer: its requests' leases (AcquireLoad), their cached chunks (Lookups), or the error."""

Question = tuple[Sequence[bytes], int]
"""A request's chunk keys, and the first chunk the daemon is asked about (vLLM has those before it)."""


class Outlook:
    """Whether the daemon's next answer is expected to bring nothing: the last :data:`MISS_RUN` answers
    (requests looked up) offered vLLM no token."""

    def __init__(self) -> None:
        self._misses = 0  # answers in a row without a hit

    def note(self, hit: bool) -> None:
        """Count one request's answer."""
        self._misses = 0 if hit else self._misses + 1

    @property
    def expect_miss(self) -> bool:
        """The last :data:`MISS_RUN` answers brought nothing."""
        return self._misses >= MISS_RUN


class Asker:
    """Makes the scheduler's daemon calls in one background thread (see the module docstring)."""

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
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tiercache-ask")

    def submit(
        self, questions: dict[Namespace, list[Question]]
    ) -> concurrent.futures.Future[dict[Namespace, Answer]]:
        """Ask the daemon in the background: one call per namespace."""
        return self._thread.submit(self._call, questions)

    def shutdown(self) -> None:
        """Finish the calls submitted, then stop the thread."""
        self._thread.shutdown(wait=True)

    def leases(self, ns: Namespace) -> bool:
        """Whether the lookup leases the prefix for the worker (TP = PP = 1 and shared memory to lease in)."""
        if not self._lease_here:
            return False

        def offered() -> bool:  # asked under auto only
            return self._client.registration(ns).segment is not None

        return daemon_medium(self._config.data_plane, offered) is Medium.SHARED_MEMORY

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
                else:
                    answers[ns] = [self._client.lookup(ns, keys, prefetch=True).chunks for keys, _ in asked]
            except TierCacheError as exc:
                answers[ns] = exc
        return answers
