"""Events keep their place across daemon restarts and replay-window overflows: an epoch and a RESYNC signal.

The hub tests run a real :class:`~tiercache.daemon.events.EventHub` on a real event loop; the restart test
runs two real daemon processes on one L3, one after the other, and resumes a subscription of the first on
the second, as a router would.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.daemon.conftest import (
    RPC_TIMEOUT_S,
    StartDaemon,
    make_keys,
    payload,
    register,
    shm_store,
)
from tiercache.daemon.events import EventHub, EventHubConfig, HubEvent, HubEventKind, needs_resync
from tiercache.proto import tiercache_pb2 as pb
from tiercache.proto import tiercache_pb2_grpc as pb_grpc
from tiercache.tiers.base import TierLevel

HANDLE = b"h" * 16


def _drain(hub: EventHub, after: int, epoch: int) -> list[HubEvent]:
    """What a subscriber resuming after ``(epoch, after)`` receives before the hub closes."""

    async def collect() -> list[HubEvent]:
        sub = hub.subscribe(after, lambda e: True, epoch)
        hub.close()
        return [event async for event in sub]

    return hub.loop.run_until_complete(collect())


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    new = asyncio.new_event_loop()
    yield new
    new.close()


def _hub(loop: asyncio.AbstractEventLoop, events: int, replay: int = 8) -> EventHub:
    hub = EventHub(loop, EventHubConfig(replay_events=replay, queue_events=64))
    for i in range(events):
        hub.publish(HubEventKind.STORED, TierLevel.L2, HANDLE, bytes([i]) * 16)
    return hub


def test_every_event_carries_the_hub_epoch_and_two_hubs_differ(loop: asyncio.AbstractEventLoop) -> None:
    first, second = _hub(loop, 3), _hub(loop, 3)
    assert first.epoch != second.epoch and first.epoch > 0 and second.epoch > 0
    got = _drain(first, 0, 0)
    assert [e.sequence for e in got] == [1, 2, 3]
    assert {e.epoch for e in got} == {first.epoch}
    assert all(e.kind is HubEventKind.STORED for e in got)


def test_resume_in_the_same_epoch_inside_the_window_gets_the_rest_without_resync(
    loop: asyncio.AbstractEventLoop,
) -> None:
    hub = _hub(loop, 5)
    got = _drain(hub, 2, hub.epoch)
    assert [(e.kind, e.sequence) for e in got] == [(HubEventKind.STORED, s) for s in (3, 4, 5)]


def test_resume_from_another_epoch_starts_with_resync_then_everything_retained(
    loop: asyncio.AbstractEventLoop,
) -> None:
    hub = _hub(loop, 3)
    got = _drain(hub, 2, hub.epoch ^ 1)  # the sequence belongs to a previous daemon
    assert got[0].kind is HubEventKind.RESYNC and got[0].epoch == hub.epoch and got[0].sequence == 0
    assert [e.sequence for e in got[1:]] == [1, 2, 3]


def test_resume_older_than_the_replay_window_is_signalled(loop: asyncio.AbstractEventLoop) -> None:
    hub = _hub(loop, 20, replay=8)  # retains 13..20
    got = _drain(hub, 3, hub.epoch)  # 4..12 are gone
    assert got[0].kind is HubEventKind.RESYNC and got[0].sequence == 12
    assert [e.sequence for e in got[1:]] == list(range(13, 21))
    exact = _hub(loop, 20, replay=8)
    assert [e.sequence for e in _drain(exact, 12, exact.epoch)] == list(range(13, 21))  # no gap: no RESYNC


def test_an_old_client_without_epoch_resuming_beyond_the_latest_is_signalled(
    loop: asyncio.AbstractEventLoop,
) -> None:
    hub = _hub(loop, 2)
    got = _drain(hub, 500, 0)  # e.g. the last number of a daemon that was restarted
    assert got[0].kind is HubEventKind.RESYNC
    assert [e.sequence for e in got[1:]] == [1, 2]


def test_needs_resync_table() -> None:
    # (epoch, after, hub_epoch, latest, oldest) -> gap?
    assert not needs_resync(0, 0, 7, 0, None)  # a new subscriber of an idle hub
    assert not needs_resync(0, 0, 7, 100, 50)  # a new subscriber takes what is retained
    assert needs_resync(7, 0, 7, 100, 50)  # saw nothing of this epoch, and 1..49 are gone
    assert not needs_resync(7, 0, 7, 100, 1)
    assert not needs_resync(7, 100, 7, 100, 50)  # up to date
    assert not needs_resync(7, 49, 7, 100, 50)
    assert needs_resync(7, 48, 7, 100, 50)
    assert needs_resync(8, 100, 7, 100, 50)
    assert needs_resync(7, 101, 7, 100, 50)
    assert not needs_resync(7, 5, 7, 5, None)  # nothing retained yet, nothing missed


def _first_events(
    stub: pb_grpc.KVCacheServiceStub, request: pb.WatchEventsRequest, n: int
) -> list[pb.CacheEvent]:
    """The first ``n`` events of a WatchEvents stream (bounded wait)."""
    call = stub.WatchEvents(request)
    got: queue.Queue[pb.CacheEvent | BaseException] = queue.Queue()

    def collect() -> None:
        try:
            for event in call:
                got.put(event)
        except grpc.RpcError as exc:
            got.put(exc)

    threading.Thread(target=collect, daemon=True).start()
    out: list[pb.CacheEvent] = []
    try:
        while len(out) < n:
            item = got.get(timeout=RPC_TIMEOUT_S)
            assert not isinstance(item, BaseException), item
            out.append(item)
    finally:
        call.cancel()
    return out


def test_a_router_resuming_on_a_restarted_daemon_is_told_to_resync(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    first = start_daemon()
    stub = first.stub()
    reg = register(stub)
    assert reg.max_ttl_s > 0  # the cap on lifetimes travels with the registration
    keys = make_keys(3, seed=71)
    assert shm_store(stub, reg, keys, [payload(i, 71) for i in range(3)]) == 3
    seen = _first_events(stub, pb.WatchEventsRequest(after_sequence=0), 3)
    old_epoch, last = seen[-1].epoch, seen[-1].sequence
    assert old_epoch != 0 and {e.epoch for e in seen} == {old_epoch}
    assert first.terminate() == 0

    second = start_daemon()
    stub = second.stub()
    reg = register(stub)
    more = make_keys(1, seed=72)
    assert shm_store(stub, reg, more, [payload(0, 72)]) == 1
    resumed = _first_events(stub, pb.WatchEventsRequest(after_sequence=last, epoch=old_epoch), 2)
    assert resumed[0].kind == pb.CacheEvent.KIND_RESYNC
    assert resumed[0].epoch not in (0, old_epoch)
    assert resumed[1].kind == pb.CacheEvent.KIND_STORED and resumed[1].sequence == 1
    assert resumed[1].epoch == resumed[0].epoch
    # In its own epoch the same router resumes without a gap and gets no RESYNC.
    again = _first_events(stub, pb.WatchEventsRequest(after_sequence=0, epoch=resumed[0].epoch), 1)
    assert again[0].kind == pb.CacheEvent.KIND_STORED and again[0].sequence == 1
