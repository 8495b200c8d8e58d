"""What the connector owes the daemon after a load, sent with its next call instead of calls of their own.

Ending a lease whose copy provably finished in time, and telling the daemon what a load was worth, need no
answer: waiting for them, or even sending them as separate one-way calls, costs the engine CPU and a round
trip on both sides while its prefill runs. :class:`PendingSettlements` keeps them per namespace until the
next AcquireLoad or BeginStore of that namespace takes them (``Settlement`` in the .proto), so a load phase
is one round trip; such a call sends the other namespaces' queued settlements one-way at once (it cannot
carry them), so that an engine juggling namespaces holds no lease longer than before. Whatever no call has taken after ``after_s`` is handed to ``send`` from a background
thread (woken by a condition at the deadline, never polling), so an idle engine's leases still end well
before their TTL; :meth:`PendingSettlements.take_all` empties everything at once (before Stats, Purge and
close, so that what they see includes it and nothing is left behind).

Primitives:
    SETTLE_AFTER_S: how long a settlement waits for a call to carry it (default of ``after_s``).
    PendingSettlements: ``release``, ``usage``, ``take`` (for one request), ``take_others``, ``take_all``,
        ``close``.
    send_alone: send one settlement as ReleaseLoad and ReportUsage calls of its own.
    tier_tokens, usage_settlement, usage_request: a usage report (loaded, effective and recomputed tokens)
        on the wire.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from tiercache.errors import TierCacheError
from tiercache.keychain import PackedKeys
from tiercache.keys import Namespace
from tiercache.proto import tiercache_pb2 as pb
from tiercache.tiers.base import TierLevel
from tiercache.wire import TIERS

logger = logging.getLogger(__name__)

SETTLE_AFTER_S = 0.5
"""Seconds a lease release or usage report waits for the namespace's next call before it is sent alone."""
MAX_READ_KEYS = 4096
"""The most chunk keys read through the published index one settlement carries (the latest; 128 KiB)."""


@dataclass(slots=True)
class _Pending:
    """One namespace's unsent settlement (mutable, guarded by the owner's lock)."""

    since: float
    lease_ids: list[int] = field(default_factory=list)
    effective: dict[TierLevel, int] = field(default_factory=dict)  # tokens
    loaded: dict[TierLevel, int] = field(default_factory=dict)  # tokens
    recomputed_tokens: int = 0
    read_keys: list[bytes] = field(default_factory=list)

    def add_usage(
        self,
        namespace: Namespace,
        chunks: Mapping[TierLevel, int],
        recomputed_tokens: int,
        loaded_tokens: Mapping[TierLevel, int] | None,
        effective_tokens: Mapping[TierLevel, int] | None,
        read_keys: Iterable[bytes] = (),
    ) -> None:
        _add(self.effective, chunks, namespace.layout.chunk_tokens)
        _add(self.effective, effective_tokens or {})
        _add(self.loaded, loaded_tokens or {})
        self.recomputed_tokens += recomputed_tokens
        self.read_keys.extend(read_keys)
        del self.read_keys[:-MAX_READ_KEYS]  # the latest reads matter for eviction

    def message(self) -> pb.Settlement:
        return pb.Settlement(
            release_lease_ids=self.lease_ids,
            effective_tokens=tier_tokens(self.effective),
            loaded_tokens=tier_tokens(self.loaded),
            recomputed_tokens=self.recomputed_tokens,
            read_keys=b"".join(self.read_keys),
        )


def tier_tokens(tokens: Mapping[TierLevel, int]) -> list[pb.TierTokens]:
    """Token counts per tier on the wire (tiers in order, zeros left out)."""
    return [pb.TierTokens(tier=TIERS.to_proto(t), tokens=n) for t, n in sorted(tokens.items()) if n > 0]


def usage_settlement(
    namespace: Namespace,
    chunks: Mapping[TierLevel, int],
    recomputed_tokens: int,
    loaded_tokens: Mapping[TierLevel, int] | None = None,
    effective_tokens: Mapping[TierLevel, int] | None = None,
    read_keys: Iterable[bytes] = (),
) -> pb.Settlement:
    """A usage report (see :meth:`PendingSettlements.usage`) as a settlement that releases nothing."""
    entry = _Pending(0.0)
    entry.add_usage(namespace, chunks, recomputed_tokens, loaded_tokens, effective_tokens, read_keys)
    return entry.message()


def usage_request(handle: bytes, settlement: pb.Settlement) -> pb.ReportUsageRequest:
    """The usage of ``settlement`` as a ReportUsage call of its own (its releases left out)."""
    request = pb.ReportUsageRequest(handle=handle, recomputed_tokens=settlement.recomputed_tokens)
    request.loaded_tokens.extend(settlement.loaded_tokens)
    request.effective_tokens.extend(settlement.effective_tokens)
    request.effective_chunks.extend(settlement.effective_chunks)
    request.read_keys = settlement.read_keys
    return request


def _add(into: dict[TierLevel, int], tokens: Mapping[TierLevel, int], scale: int = 1) -> None:
    for tier, n in tokens.items():
        into[tier] = into.get(tier, 0) + n * scale


class PendingSettlements:
    """Lease releases and usage reports per namespace, waiting for a call to carry them. Thread-safe.

    Args:
        send: sends one namespace's settlement on its own (called from the background thread); must not
            raise for daemon trouble.
        after_s: how long a settlement waits for a call to take it.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        send: Callable[[Namespace, pb.Settlement], None],
        after_s: float = SETTLE_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._send = send
        self._after_s = after_s
        self._clock = clock
        self._pending: dict[Namespace, _Pending] = {}
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def release(self, namespace: Namespace, lease_id: int) -> None:
        """Queue the release of a lease whose copy finished in time."""
        with self._cond:
            self._entry(namespace).lease_ids.append(lease_id)

    def usage(
        self,
        namespace: Namespace,
        chunks: Mapping[TierLevel, int],
        recomputed_tokens: int,
        loaded_tokens: Mapping[TierLevel, int] | None = None,
        effective_tokens: Mapping[TierLevel, int] | None = None,
        read_keys: Iterable[bytes] = (),
    ) -> None:
        """Queue a usage report (added to what is queued already): whole chunks whose prefill was skipped per
        source tier (``chunks``) and further such tokens (``effective_tokens``), tokens recomputed anyway,
        tokens copied out of the cache intact and in time per source tier (``loaded_tokens``), and the keys
        of chunks read out of L2 through the published index (``read_keys``: the daemon counts each as a
        read of its L2 copy; the latest :data:`MAX_READ_KEYS` are kept)."""
        with self._cond:
            self._entry(namespace).add_usage(
                namespace, chunks, recomputed_tokens, loaded_tokens, effective_tokens, read_keys
            )

    def take(self, namespace: Namespace) -> pb.Settlement | None:
        """The namespace's settlement for the request about to be sent (None when nothing is queued)."""
        with self._cond:
            entry = self._pending.pop(namespace, None)
        return None if entry is None else entry.message()

    def take_others(self, namespace: Namespace) -> list[tuple[Namespace, pb.Settlement]]:
        """Every queued settlement of the other namespaces, emptied (a call of ``namespace`` cannot carry
        them: the daemon settles only the caller's handle)."""
        with self._cond:
            if not self._pending or list(self._pending) == [namespace]:
                return []
            others = [ns for ns in self._pending if ns != namespace]
            taken = [(ns, self._pending.pop(ns)) for ns in others]
        return [(ns, entry.message()) for ns, entry in taken]

    def take_all(self) -> list[tuple[Namespace, pb.Settlement]]:
        """Every queued settlement, emptied."""
        with self._cond:
            taken, self._pending = self._pending, {}
        return [(ns, entry.message()) for ns, entry in taken.items()]

    def close(self) -> None:
        """Stop the background thread (idempotent); what is still queued stays for :meth:`take_all`."""
        with self._cond:
            self._closed = True
            thread, self._thread = self._thread, None
            self._cond.notify_all()
        if thread is not None:
            thread.join()

    def _entry(self, namespace: Namespace) -> _Pending:
        """The namespace's entry (lock held); starts the background thread on first use."""
        entry = self._pending.get(namespace)
        if entry is None:
            entry = self._pending[namespace] = _Pending(self._clock())
            self._cond.notify_all()
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._run, name="tiercache-settle", daemon=True)
            self._thread.start()
        return entry

    def _run(self) -> None:
        """Send each settlement no call took within ``after_s``; sleep on the condition until the next due."""
        while True:
            with self._cond:
                while not self._closed:
                    now = self._clock()
                    due = [ns for ns, e in self._pending.items() if now >= e.since + self._after_s]
                    if due:
                        break
                    first = min((e.since for e in self._pending.values()), default=None)
                    self._cond.wait(None if first is None else first + self._after_s - now)
                if self._closed:
                    return
                ready = [(ns, self._pending.pop(ns).message()) for ns in due]
            for ns, message in ready:
                try:
                    self._send(ns, message)
                except Exception:  # a bug in send must not end the thread: the leases would wait for TTLs
                    logger.exception("sending a settlement failed")


class _Sender(Protocol):
    """The client calls a settlement sent on its own is made of."""

    def release_load(self, namespace: Namespace, lease_id: int) -> bool: ...

    def release_load_nowait(self, namespace: Namespace, lease_id: int) -> None: ...

    def report_usage(
        self,
        namespace: Namespace,
        effective_chunks: Mapping[TierLevel, int],
        recomputed_tokens: int,
        wait: bool = True,
        loaded_tokens: Mapping[TierLevel, int] | None = None,
        effective_tokens: Mapping[TierLevel, int] | None = None,
        read_keys: Iterable[bytes] = (),
    ) -> None: ...


def _tokens(counts: Iterable[pb.TierTokens]) -> dict[TierLevel, int]:
    return {TIERS.from_proto(int(c.tier), "tier"): int(c.tokens) for c in counts}


def send_alone(client: _Sender, namespace: Namespace, message: pb.Settlement, wait: bool) -> None:
    """Send a settlement no call carried as ReleaseLoad per lease and one ReportUsage, waited or one-way.

    Daemon trouble is logged, never raised: the leases then lapse at their TTL.
    """
    counts = {TIERS.from_proto(int(c.tier), "tier"): int(c.chunks) for c in message.effective_chunks}
    loaded, effective = _tokens(message.loaded_tokens), _tokens(message.effective_tokens)
    read = PackedKeys(message.read_keys) if message.read_keys else ()
    try:
        for lease_id in message.release_lease_ids:
            if wait:
                client.release_load(namespace, lease_id)
            else:
                client.release_load_nowait(namespace, lease_id)
        if counts or loaded or effective or message.recomputed_tokens or read:
            client.report_usage(
                namespace,
                counts,
                int(message.recomputed_tokens),
                wait=wait,
                loaded_tokens=loaded,
                effective_tokens=effective,
                read_keys=read,
            )
    except TierCacheError as exc:
        logger.info("settling deferred releases and usage failed (%s); leases lapse at their TTL", exc)
