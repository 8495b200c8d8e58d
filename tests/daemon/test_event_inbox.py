"""The event hub's hand-over from the cache to the event loop, over a real cache (L2 in shared memory) and a
real event loop: a commit of many chunks on another thread while the loop is busy reaches a subscriber as
every event, numbered in the order the cache changed, after a single wake-up of the loop (one is pending at
most: the events handed over meanwhile ride on it). The loop publishes a batch ``handover_s`` after it is
woken for it: events of the cache's operations in that time (one chunk's promotion after another) take no
wake-up of their own, also while the loop is idle."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch

from tiercache.cache import CacheManager
from tiercache.daemon.events import (
    HANDOVER_S,
    EventHub,
    EventHubConfig,
    HubEvent,
    HubEventKind,
    Subscription,
)
from tiercache.keys import Namespace, chunk_keys
from tiercache.layout import KVDtype, KVLayout
from tiercache.tiers.base import TierLevel
from tiercache.tiers.host import HostTier, HostTierConfig

LAYOUT = KVLayout(
    num_layers=2, num_kv_heads=2, head_dim=16, dtype=KVDtype.BFLOAT16, chunk_tokens=16, page_tokens=16
)
NS = Namespace("test/events", "r1", LAYOUT)
CHUNKS = 200


class _CountingLoop:
    """The hub's view of a real event loop that counts the wake-ups asked of it from other threads."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.wakeups = 0

    def call_soon_threadsafe(self, callback: Callable[..., object], *args: Any) -> asyncio.Handle:
        self.wakeups += 1
        return self.loop.call_soon_threadsafe(callback, *args)


def _drained(
    loop: asyncio.AbstractEventLoop, hub: EventHub, sub: Subscription, wait_s: float
) -> list[HubEvent]:
    """Run the loop ``wait_s`` (a pending drain runs), close the hub and take every event ``sub`` got."""

    async def collect() -> list[HubEvent]:
        await asyncio.sleep(wait_s)
        hub.close()
        return [event async for event in sub]

    return loop.run_until_complete(collect())


@pytest.fixture
def cache() -> Iterator[tuple[CacheManager, bytes]]:
    nbytes = LAYOUT.chunk_bytes
    l2 = HostTier(
        HostTierConfig(capacity_bytes=2 * CHUNKS * nbytes, slot_bytes=nbytes, segment_prefix="tc-events")
    )
    manager = CacheManager([l2])
    try:
        yield manager, manager.register_namespace(NS)
    finally:
        manager.close()


def test_a_commit_on_another_thread_while_the_loop_is_busy_arrives_whole_in_order_in_one_wakeup(
    cache: tuple[CacheManager, bytes],
) -> None:
    manager, handle = cache
    keys = chunk_keys(NS, list(range(CHUNKS * LAYOUT.chunk_tokens)))
    loop = asyncio.new_event_loop()
    counting = _CountingLoop(loop)
    hub = EventHub(counting, None)  # type: ignore[arg-type]  # a real loop behind a counter
    detach = hub.attach(manager)

    def store() -> int:
        ticket = manager.begin_store(handle, keys, TierLevel.L2)
        for slot in ticket.slots:
            slot.buffer.fill_(slot.index % 251)
        return manager.commit_store(ticket.ticket_id)

    async def run() -> list[HubEvent]:
        got: list[HubEvent] = []
        async for event in sub:
            got.append(event)
            if len(got) == CHUNKS:
                break
        return got

    try:
        sub = hub.subscribe(0, lambda e: True)
        with ThreadPoolExecutor(1) as pool:  # the loop is not running: busy, as far as the hub can tell
            assert pool.submit(store).result() == CHUNKS
        got = loop.run_until_complete(run())
    finally:
        detach()
        hub.close()
        loop.close()
    assert [e.sequence for e in got] == list(range(1, CHUNKS + 1))
    assert [e.key for e in got] == keys
    assert all(e.kind is HubEventKind.STORED and e.level is TierLevel.L2 for e in got)
    assert hub.sequence == CHUNKS
    assert counting.wakeups == 1


def test_events_after_the_loop_closed_are_dropped_without_error(cache: tuple[CacheManager, bytes]) -> None:
    manager, handle = cache
    loop = asyncio.new_event_loop()
    hub = EventHub(loop)
    detach = hub.attach(manager)
    loop.close()
    try:
        keys = chunk_keys(NS, list(range(3 * LAYOUT.chunk_tokens)))
        manager.put(handle, keys, [torch.zeros(LAYOUT.chunk_bytes, dtype=torch.uint8)] * 3)
        later = chunk_keys(NS, list(range(1000, 1000 + LAYOUT.chunk_tokens)))
        manager.put(handle, later, [torch.zeros(LAYOUT.chunk_bytes, dtype=torch.uint8)])
        assert manager.lookup(handle, later).chunks == 1  # the cache went on; the hub kept nothing
        assert hub._inbox == []
    finally:
        detach()


def test_events_after_a_drain_wake_the_loop_again(cache: tuple[CacheManager, bytes]) -> None:
    manager, handle = cache
    loop = asyncio.new_event_loop()
    hub = EventHub(loop)
    detach = hub.attach(manager)
    first = chunk_keys(NS, list(range(5 * LAYOUT.chunk_tokens)))
    second = chunk_keys(NS, list(range(10_000, 10_000 + 4 * LAYOUT.chunk_tokens)))
    blank = torch.zeros(LAYOUT.chunk_bytes, dtype=torch.uint8)
    try:
        sub = hub.subscribe(0, lambda e: True)
        with ThreadPoolExecutor(1) as pool:
            pool.submit(manager.put, handle, first, [blank] * 5).result()
            loop.run_until_complete(asyncio.sleep(5 * HANDOVER_S))  # the first batch's drain runs
            assert hub.sequence == 5
            pool.submit(
                manager.put, handle, second, [blank] * 4
            ).result()  # a new batch: not left in the inbox

        got = _drained(loop, hub, sub, 5 * HANDOVER_S)  # the second drain runs
    finally:
        detach()
        loop.close()
    assert [e.key for e in got] == first + second
    assert [e.sequence for e in got] == list(range(1, 10))


def test_events_while_a_handover_is_pending_take_no_wakeup_of_their_own(
    cache: tuple[CacheManager, bytes],
) -> None:
    manager, handle = cache
    loop = asyncio.new_event_loop()
    counting = _CountingLoop(loop)
    hub = EventHub(counting, EventHubConfig(handover_s=0.5))  # type: ignore[arg-type]  # a real loop
    detach = hub.attach(manager)
    first = chunk_keys(NS, list(range(3 * LAYOUT.chunk_tokens)))
    second = chunk_keys(NS, list(range(20_000, 20_000 + 2 * LAYOUT.chunk_tokens)))
    blank = torch.zeros(LAYOUT.chunk_bytes, dtype=torch.uint8)
    try:
        sub = hub.subscribe(0, lambda e: True)
        with ThreadPoolExecutor(1) as pool:
            pool.submit(manager.put, handle, first, [blank] * 3).result()
            loop.run_until_complete(asyncio.sleep(0))  # the loop takes the wake-up, the drain is pending
            assert len(hub._inbox) == 3
            pool.submit(manager.put, handle, second, [blank] * 2).result()  # while the loop idles
            assert len(hub._inbox) == 5

        got = _drained(loop, hub, sub, 0.6)  # the pending drain runs
    finally:
        detach()
        loop.close()
    assert [e.key for e in got] == first + second
    assert [e.sequence for e in got] == list(range(1, 6))
    assert counting.wakeups == 1


def test_an_event_published_on_the_loop_comes_after_the_events_handed_over_before_it(
    cache: tuple[CacheManager, bytes],
) -> None:
    manager, handle = cache
    loop = asyncio.new_event_loop()
    hub = EventHub(loop, EventHubConfig(handover_s=60.0))  # the hand-over would come long after
    detach = hub.attach(manager)
    keys = chunk_keys(NS, list(range(30_000, 30_000 + 2 * LAYOUT.chunk_tokens)))
    try:
        sub = hub.subscribe(0, lambda e: True)
        manager.put(handle, keys, [torch.zeros(LAYOUT.chunk_bytes, dtype=torch.uint8)] * 2)

        async def clear() -> list[HubEvent]:
            hub.publish(HubEventKind.CLEARED, None, handle)  # (as Purge does, on the loop)
            hub.close()
            return [event async for event in sub]

        got = loop.run_until_complete(clear())
    finally:
        detach()
        loop.close()
    assert [e.kind for e in got] == [HubEventKind.STORED, HubEventKind.STORED, HubEventKind.CLEARED]
    assert [e.key for e in got[:2]] == keys
    assert [e.sequence for e in got] == [1, 2, 3]
