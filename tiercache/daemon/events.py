"""The event hub: chunk stored / removed / namespace cleared, numbered, retained and fanned out.

Each tenant has a stream of its own (the hub's ``scope`` of an event's handle: with tokens, the tenant that
registered it): its own sequence numbers, replay buffer and subscribers. One counter for everybody would
tell a tenant how much every other tenant does (a subscriber probing resume points for RESYNC could count
another tenant's events one by one); a stream of its own tells it of its own events only.

Every hub draws a random 63-bit ``epoch`` when it is made (once per daemon process): sequence numbers
restart at 1 with a new epoch, so a (epoch, sequence) pair names one event for good. A subscriber resumes
with the last pair it saw; when the hub cannot give it every event after that point (another epoch: the
daemon restarted; a sequence beyond the latest; one older than the replay window) its stream starts with a
RESYNC event (sequence: the last event it will not receive) before the retained events it can still get.

The cache manager calls its listeners under its lock, on whatever thread changed the cache; the hub's
listener only hands the event to the event loop, where it gets the next sequence number, enters a bounded
replay buffer and is queued for every subscriber. Events are handed over in batches, in order: the listener
appends to an inbox and wakes the loop (``call_soon_threadsafe``) only when no wake-up is pending; the loop
publishes every event in the inbox :data:`HANDOVER_S` later (``EventHubConfig.handover_s``). A commit of
512 chunks used to wake the loop 512 times (a write to its self-pipe each and as many loop iterations,
competing with the streams for the cores: ~2 ms of a ~24 ms stream-store commit of 512 chunks on the 2-core
dev host). Promotions and write-downs emit one event per chunk under the cache's lock, on their own
threads: a wake-up per chunk (a socket write that gives up the GIL, then waits up to the switch interval to
take it back, the lock held) was a third of the samples of AcquireLoads promoting from L3 under ``vllm
serve``. An event published on the loop (a namespace's CLEARED) and ``latest`` / ``subscribe`` take the
inbox first: the order stays the order the cache changed. A
subscriber first receives the retained events after the sequence number it asks for, then live ones. A
subscriber whose bounded queue overflows is ended with :class:`~tiercache.errors.CapacityError` after the
events it already has (it can resubscribe with the last sequence it saw); closing the hub ends every
subscription cleanly.

All methods except the manager listener run on the event loop.

Primitives:
    HubEventKind, HubEvent: a numbered event (``handle`` is the namespace id the chunk is filed under).
    new_epoch: a random non-zero epoch.
    needs_resync: whether a resume point cannot be served without a gap.
    EventHubConfig: replay buffer and per-subscriber queue bounds.
    EventHub: ``attach(manager)``, ``publish``, ``subscribe(after, accept, epoch, scope)``, ``latest(scope)``,
        ``close``.
    Subscription: an async iterator of HubEvents.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import secrets
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from tiercache.cache import CacheManager
from tiercache.errors import CapacityError
from tiercache.stats import ChunkEvent, EventKind
from tiercache.tiers.base import TierLevel

logger = logging.getLogger(__name__)


class HubEventKind(enum.Enum):
    """What happened."""

    STORED = "stored"
    REMOVED = "removed"
    CLEARED = "cleared"
    RESYNC = "resync"  # the subscriber missed events: what it derived from earlier ones is stale


HANDOVER_S = 0.002
"""How long after the first event of a batch the loop publishes the batch: one wake-up of the loop serves
every event of the cache's operations in that time (a promotion of a prompt's chunks, a write-down run)."""

_FROM_CHUNK = {EventKind.STORED: HubEventKind.STORED, EventKind.REMOVED: HubEventKind.REMOVED}


@dataclass(frozen=True, slots=True)
class HubEvent:
    """A numbered cache event.

    Attributes:
        sequence: 1, 2, 3, ... in the order the cache changed (per epoch and stream); for RESYNC, the last
            sequence the subscriber will not receive.
        kind: stored, removed, cleared (a namespace was purged) or resync.
        level: the tier, None for CLEARED.
        handle: the namespace id.
        key: the chunk key, empty for CLEARED.
        evicted: for REMOVED, whether it was evicted for room.
        epoch: the hub's epoch (one per daemon process).
        source: for STORED, the tier the copy came from (SHARED: it arrived through the shared tier).
    """

    sequence: int
    kind: HubEventKind
    level: TierLevel | None
    handle: bytes
    key: bytes
    evicted: bool
    epoch: int = 0
    source: TierLevel | None = None


def new_epoch() -> int:
    """A random epoch in ``1 .. 2**63 - 1`` (0 means "not known" on the wire)."""
    return secrets.randbits(63) or 1


def needs_resync(epoch: int, after_sequence: int, hub_epoch: int, latest: int, oldest: int | None) -> bool:
    """Whether resuming after ``(epoch, after_sequence)`` would miss events.

    Args:
        epoch: the subscriber's epoch (0: not known, e.g. an old client; its sequence is then taken as
            this epoch's).
        after_sequence: the last sequence it saw (0: none, it wants what is retained).
        hub_epoch: the hub's epoch.
        latest: the hub's latest sequence.
        oldest: the oldest retained sequence (None when nothing is retained).
    """
    if epoch not in (0, hub_epoch):
        return True
    if after_sequence > latest:  # a sequence of another epoch, or a client's mistake: either way, a gap
        return True
    if after_sequence == 0 and epoch == 0:
        return False  # a new subscriber asks for what is retained, it missed nothing it knew of
    first = oldest if oldest is not None else latest + 1
    return after_sequence + 1 < first


@dataclass(frozen=True, slots=True)
class EventHubConfig:
    """Bounds of the hub.

    Attributes:
        replay_events: events retained for subscribers that resume after a sequence number.
        queue_events: events a subscriber may fall behind before it is dropped.
        handover_s: how long after the first event of a batch the loop publishes the batch.
    """

    replay_events: int = 65536
    queue_events: int = 8192
    handover_s: float = HANDOVER_S


class Subscription:
    """The events of one subscriber, as an async iterator; ``close`` ends it."""

    def __init__(
        self, accept: Callable[[HubEvent], bool], limit: int, on_close: Callable[[Subscription], None]
    ) -> None:
        """Args: accept: which events this subscriber sees; limit: queue bound; on_close: unregisters it."""
        self._accept = accept
        self._limit = limit
        self._on_close = on_close
        self._pending: deque[HubEvent] = deque()
        self._wake = asyncio.Event()
        self._overflowed = False
        self._closed = False

    def _offer(self, event: HubEvent, replay: bool = False) -> None:
        if self._closed or self._overflowed or not self._accept(event):
            return
        if not replay and len(self._pending) >= self._limit:
            self._overflowed = True
        else:
            self._pending.append(event)
        self._wake.set()

    def _end(self) -> None:
        self._closed = True
        self._wake.set()

    def close(self) -> None:
        """Stop receiving events (idempotent)."""
        if not self._closed:
            self._end()
            self._on_close(self)

    def __aiter__(self) -> AsyncIterator[HubEvent]:
        return self

    async def __anext__(self) -> HubEvent:
        """The next event.

        Raises:
            StopAsyncIteration: the subscription or the hub was closed.
            CapacityError: this subscriber fell more than the queue bound behind.
        """
        while True:
            if self._pending:
                return self._pending.popleft()
            if self._closed:
                raise StopAsyncIteration
            if self._overflowed:
                self.close()
                raise CapacityError(
                    f"events: this subscriber fell more than {self._limit} events behind; "
                    "resubscribe with after_sequence set to the last sequence received"
                )
            self._wake.clear()
            await self._wake.wait()


def _one_scope(handle: bytes) -> str:
    return ""


@dataclass(slots=True)
class _Stream:
    """The events of one scope (tenant): its numbering, replay buffer and subscribers."""

    retained: deque[HubEvent]
    sequence: int = 0
    subscribers: set[Subscription] = field(default_factory=set)


class EventHub:
    """Numbers cache events per stream (tenant), keeps the latest ones and fans them out to subscribers."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        config: EventHubConfig | None = None,
        scope: Callable[[bytes], str | None] | None = None,
    ) -> None:
        """Args: loop: the event loop every method but the manager listener runs on; config: bounds; scope:
        the stream an event of a handle belongs to (its tenant; None: the event is nobody's and is dropped);
        None: one stream, ``""``, for every event."""
        self._loop = loop
        self._config = config or EventHubConfig()
        self._scope = scope or _one_scope
        self._streams: dict[str, _Stream] = {}
        self._closed = False
        self._inbox: list[ChunkEvent] = []  # handed over by the manager, not yet published
        self._inbox_lock = threading.Lock()
        self._wake_pending = False  # the loop is woken for the inbox: it publishes every event in it
        self.epoch = new_epoch()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the hub runs on."""
        return self._loop

    @property
    def sequence(self) -> int:
        """The sequence number of the latest event of stream ``""`` (0 before the first)."""
        return self.latest("")

    def latest(self, scope: str) -> int:
        """The sequence number of the latest event of a stream (0 before the first), the cache's events
        handed over so far included."""
        self._drain()
        stream = self._streams.get(scope)
        return stream.sequence if stream is not None else 0

    def _stream(self, scope: str) -> _Stream:
        stream = self._streams.get(scope)
        if stream is None:
            stream = self._streams[scope] = _Stream(deque(maxlen=self._config.replay_events))
        return stream

    def attach(self, manager: CacheManager) -> Callable[[], None]:
        """Listen to the manager's chunk events; returns the function that stops listening."""
        return manager.subscribe(self._from_manager)

    def _from_manager(self, event: ChunkEvent) -> None:
        """Manager listener: runs under the manager's lock on any thread; only hands over to the loop (woken
        when no wake-up is pending: the drain it is woken for takes this event too)."""
        with self._inbox_lock:
            self._inbox.append(event)
            if self._wake_pending:
                return
            self._wake_pending = True
        try:
            self._loop.call_soon_threadsafe(self._drain_soon)
        except RuntimeError:  # the loop is closed: the daemon is gone (and nothing will drain the inbox)
            with self._inbox_lock:
                self._inbox.clear()
                self._wake_pending = False
            logger.debug("event after the event loop closed: %s", event)

    def _drain_soon(self) -> None:
        """Publish the inbox ``handover_s`` from now (on the loop: the events of that time ride along)."""
        asyncio.get_running_loop().call_later(self._config.handover_s, self._drain)

    def _drain(self) -> None:
        """Publish the events handed over so far, in order (on the loop)."""
        with self._inbox_lock:
            events, self._inbox = self._inbox, []
            self._wake_pending = False
        for event in events:
            self._number(
                _FROM_CHUNK[event.kind],
                event.level,
                event.namespace_id,
                event.key,
                event.evicted,
                event.source,
            )

    def publish(
        self,
        kind: HubEventKind,
        level: TierLevel | None,
        handle: bytes,
        key: bytes = b"",
        evicted: bool = False,
        source: TierLevel | None = None,
    ) -> HubEvent | None:
        """Number an event in its stream, retain it there and queue it for every subscriber of the stream that
        accepts it (None once closed, or when the handle's event is nobody's). The cache's events handed
        over before it are published first: a namespace's CLEARED comes after its chunks' events."""
        self._drain()
        return self._number(kind, level, handle, key, evicted, source)

    def _number(
        self,
        kind: HubEventKind,
        level: TierLevel | None,
        handle: bytes,
        key: bytes,
        evicted: bool,
        source: TierLevel | None,
    ) -> HubEvent | None:
        """:meth:`publish` without the inbox."""
        scope = self._scope(bytes(handle))
        if self._closed or scope is None:
            return None
        stream = self._stream(scope)
        stream.sequence += 1
        event = HubEvent(
            stream.sequence, kind, level, bytes(handle), bytes(key), evicted, epoch=self.epoch, source=source
        )
        stream.retained.append(event)
        for sub in list(stream.subscribers):
            sub._offer(event)
        return event

    def subscribe(
        self, after_sequence: int, accept: Callable[[HubEvent], bool], epoch: int = 0, scope: str = ""
    ) -> Subscription:
        """A subscription that first replays the retained events numbered above ``after_sequence``.

        When that would leave a gap (see :func:`needs_resync`) the subscription starts with a RESYNC event
        and replays every retained event.

        Args:
            after_sequence: the last sequence number the subscriber has seen (0 for everything retained).
            accept: which events the subscriber may see (its tenant's namespaces); RESYNC always passes.
            epoch: the epoch of ``after_sequence`` (0: not known).
            scope: the stream (the subscriber's tenant): its numbers, its retained events, its RESYNC.
        """
        self._drain()  # (the cache's events so far are numbered: replayed, not live)
        stream = self._stream(scope)
        sub = Subscription(accept, self._config.queue_events, stream.subscribers.discard)
        if self._closed:
            sub._end()
            return sub
        retained = stream.retained
        oldest = retained[0].sequence if retained else None
        if needs_resync(epoch, after_sequence, self.epoch, stream.sequence, oldest):
            first = oldest if oldest is not None else stream.sequence + 1
            logger.info(
                "events: a subscriber resumes after (epoch %#x, sequence %d); hub is at (%#x, %d), "
                "oldest retained %s: sending RESYNC",
                epoch,
                after_sequence,
                self.epoch,
                stream.sequence,
                oldest,
            )
            sub._pending.append(HubEvent(first - 1, HubEventKind.RESYNC, None, b"", b"", False, self.epoch))
            sub._wake.set()
            after_sequence = 0
        for event in retained:
            if event.sequence > after_sequence:
                sub._offer(event, replay=True)
        stream.subscribers.add(sub)
        return sub

    def close(self) -> None:
        """End every subscription; later events are dropped (idempotent)."""
        self._closed = True
        for stream in self._streams.values():
            for sub in list(stream.subscribers):
                sub._end()
            stream.subscribers.clear()
