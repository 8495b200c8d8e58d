"""A subscription to the daemon's ``WatchEvents`` feed on a thread of its own, resumed after failures.

An engine adapter that turns tiercache's contents into its engine's own cache events (vLLM's KV events:
:mod:`tiercache.connector.vllm.kv_events`) needs every chunk the daemon stores or drops in its tenant's
namespaces, whoever stored it. :class:`EventWatch` keeps one WatchEvents stream open on a channel of its own
(the call has no deadline, and must not hold up the client's calls), hands each event to a callback as a
:class:`WatchedEvent`, and when the stream breaks (daemon restart, network) subscribes again after a
backoff, resuming after the last (epoch, sequence) it saw: the daemon answers a resume point it cannot serve
without a gap with a RESYNC event first, which the callback sees like any other.

Primitives:
    WatchedKind: stored, removed, cleared (a namespace was purged), resync (events were missed).
    WatchedEvent: one event (tier, namespace handle, chunk key, evicted, source tier).
    EventWatch: ``start``, ``wait_live`` (the first subscription is in place), ``close``.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from tiercache.proto import tiercache_pb2 as pb
from tiercache.proto.tiercache_pb2_grpc import KVCacheServiceStub
from tiercache.tiers.base import TierLevel
from tiercache.wire import TIERS

from .backoff import Backoff, BackoffConfig
from .channel import ChannelConfig, Endpoint, auth_metadata, open_channel

logger = logging.getLogger(__name__)

RESUBSCRIBE = BackoffConfig(initial_s=0.5, factor=2.0, max_s=30.0)
"""Delays between subscription attempts after a broken stream."""


class WatchedKind(enum.Enum):
    """What happened to a chunk (or a namespace, or the stream)."""

    STORED = "stored"
    REMOVED = "removed"
    CLEARED = "cleared"
    RESYNC = "resync"


_KINDS = {
    pb.CacheEvent.KIND_STORED: WatchedKind.STORED,
    pb.CacheEvent.KIND_REMOVED: WatchedKind.REMOVED,
    pb.CacheEvent.KIND_CLEARED: WatchedKind.CLEARED,
    pb.CacheEvent.KIND_RESYNC: WatchedKind.RESYNC,
}


@dataclass(frozen=True, slots=True)
class WatchedEvent:
    """One event of the daemon's feed.

    Attributes:
        kind: what happened.
        tier: the tier a chunk was stored in or removed from (None for CLEARED and RESYNC).
        handle: the namespace's handle (the registration's; empty for RESYNC).
        key: the chunk key (empty for CLEARED and RESYNC).
        evicted: for REMOVED, whether the chunk was evicted for room (else deleted: purge, corrupt).
        source: for STORED, the tier the copy came from (None: an engine's store).
    """

    kind: WatchedKind
    tier: TierLevel | None
    handle: bytes
    key: bytes
    evicted: bool = False
    source: TierLevel | None = None


def _tier(value: int) -> TierLevel | None:
    return TIERS.lookup(value) if value else None


def watched(msg: pb.CacheEvent) -> WatchedEvent | None:
    """The event of a wire CacheEvent (None: a kind this connector does not know)."""
    kind = _KINDS.get(msg.kind)
    if kind is None:
        return None
    return WatchedEvent(
        kind, _tier(msg.tier), bytes(msg.handle), bytes(msg.key), msg.evicted, _tier(msg.source)
    )


class EventWatch:
    """The daemon's event feed, delivered to ``on_event`` on a background thread (see the module docstring).

    ``on_event`` runs on the watch thread, one event at a time, in the daemon's order; an exception it
    raises is logged and the event skipped.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        token: str | None,
        channel: ChannelConfig,
        on_event: Callable[[WatchedEvent], None],
        backoff: BackoffConfig = RESUBSCRIBE,
    ) -> None:
        self._endpoint = endpoint
        self._metadata = auth_metadata(token)
        self._channel_config = channel
        self._on_event = on_event
        self._backoff = Backoff(backoff)
        self._closed = threading.Event()
        self._live = threading.Event()
        self._lock = threading.Lock()
        self._call: Any = None
        self._epoch = 0
        self._sequence = 0
        self._thread = threading.Thread(target=self._run, name="tiercache-events", daemon=True)

    def start(self) -> EventWatch:
        """Start watching (returns self)."""
        self._thread.start()
        return self

    def wait_live(self, timeout_s: float) -> bool:
        """Wait until a subscription is in place (every later change reaches the callback)."""
        return self._live.wait(timeout_s)

    def close(self) -> None:
        """Stop watching and wait for the thread (idempotent)."""
        self._closed.set()
        with self._lock:
            call = self._call
        if call is not None:
            call.cancel()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=10.0)

    def _run(self) -> None:
        channel = open_channel(self._endpoint, self._channel_config)
        try:
            stub = KVCacheServiceStub(channel)
            while not self._closed.is_set():
                if self._subscribe(stub):
                    self._backoff.succeeded()
                if self._closed.wait(self._backoff.failed()):
                    break
        finally:
            channel.close()

    def _subscribe(self, stub: KVCacheServiceStub) -> bool:
        """Follow one subscription until it ends; True when it delivered anything or went live."""
        request = pb.WatchEventsRequest(after_sequence=self._sequence, epoch=self._epoch)
        call = stub.WatchEvents(request, metadata=self._metadata)
        with self._lock:
            self._call = call
        if self._closed.is_set():
            call.cancel()
        went_live = False
        try:
            call.initial_metadata()  # sent once the daemon's subscription is in place
            went_live = True
            self._live.set()
            for msg in call:
                self._epoch, self._sequence = int(msg.epoch), int(msg.sequence)
                event = watched(msg)
                if event is None:
                    continue
                try:
                    self._on_event(event)
                except Exception:
                    logger.exception("tiercache event %s not handled", event)
        except grpc.RpcError as exc:
            if not self._closed.is_set():
                logger.info("tiercache event feed broke (%s); subscribing again", exc.code())
        finally:
            with self._lock:
                self._call = None
        return went_live
