"""The event hub takes the manager's chunk events in batches: one loop wake-up for the events handed over
while none was pending, every event published once, in order, with consecutive sequence numbers.

A real :class:`~tiercache.daemon.events.EventHub` on a real event loop; the manager's side is its listener
called from another thread, as the cache manager calls it (under its lock, on the thread that changed the
cache).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tiercache.daemon.events import EventHub, HubEvent, HubEventKind
from tiercache.stats import ChunkEvent, EventKind
from tiercache.tiers.base import TierLevel

HANDLE = b"h" * 16


class _Listeners:
    """What the hub attaches to: the manager's ``subscribe`` (the listener is called as the manager does)."""

    def __init__(self) -> None:
        self.listener: Callable[[ChunkEvent], None] | None = None

    def subscribe(self, listener: Callable[[ChunkEvent], None]) -> Callable[[], None]:
        self.listener = listener
        return lambda: None


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    new = asyncio.new_event_loop()
    yield new
    new.close()


def _emit_from_thread(listener: Callable[[ChunkEvent], None], events: list[ChunkEvent]) -> None:
    worker = threading.Thread(target=lambda: [listener(e) for e in events])
    worker.start()
    worker.join()


def _events(n: int, start: int = 0) -> list[ChunkEvent]:
    kinds = (EventKind.STORED, EventKind.REMOVED)
    return [ChunkEvent(kinds[i % 2], TierLevel.L2, HANDLE, i.to_bytes(16, "big")) for i in range(start, n)]


def _received(hub: EventHub, loop: asyncio.AbstractEventLoop, sub: Any) -> list[HubEvent]:
    async def collect() -> list[HubEvent]:
        await asyncio.sleep(0)  # the drains woken for run first
        hub.close()
        return [event async for event in sub]

    return loop.run_until_complete(collect())


def test_events_handed_over_together_wake_the_loop_once_and_keep_their_order(
    loop: asyncio.AbstractEventLoop,
) -> None:
    hub = EventHub(loop)
    manager = _Listeners()
    hub.attach(manager)  # type: ignore[arg-type]  # the manager's listener registry, nothing else is used
    assert manager.listener is not None
    wakes = 0
    wake = loop.call_soon_threadsafe

    def counted(callback: Callable[..., object], *args: Any) -> Any:
        nonlocal wakes
        wakes += 1
        return wake(callback, *args)

    loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
    sub = hub.subscribe(0, lambda e: True)
    _emit_from_thread(manager.listener, _events(300))  # the loop is not running: nothing drains meanwhile
    assert wakes == 1
    got = _received(hub, loop, sub)
    assert [e.sequence for e in got] == list(range(1, 301))
    assert [int.from_bytes(e.key, "big") for e in got] == list(range(300))
    assert [e.kind for e in got[:2]] == [HubEventKind.STORED, HubEventKind.REMOVED]
    assert hub.sequence == 300


def test_events_after_a_drain_wake_the_loop_again(loop: asyncio.AbstractEventLoop) -> None:
    hub = EventHub(loop)
    manager = _Listeners()
    hub.attach(manager)  # type: ignore[arg-type]
    assert manager.listener is not None
    sub = hub.subscribe(0, lambda e: True)
    _emit_from_thread(manager.listener, _events(5))
    loop.run_until_complete(asyncio.sleep(0))
    assert hub.sequence == 5
    _emit_from_thread(manager.listener, _events(9, start=5))  # a new batch: not left in the inbox
    got = _received(hub, loop, sub)
    assert [int.from_bytes(e.key, "big") for e in got] == list(range(9))
    assert [e.sequence for e in got] == list(range(1, 10))
