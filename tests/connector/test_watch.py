"""The connector's subscription to the daemon's event feed (:mod:`tiercache.connector.watch`) against a real
daemon process: events arrive with their tier and key, and after the daemon restarts the watch subscribes
again on its own; the feed then starts with RESYNC (its resume point belongs to the old epoch), and the new
daemon's events follow.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.connector.conftest import connector_daemon
from tiercache.connector import TierCacheClient
from tiercache.connector.channel import ChannelConfig, parse_address
from tiercache.connector.watch import EventWatch, WatchedEvent, WatchedKind
from tiercache.keys import Namespace, chunk_keys
from tiercache.layout import KVDtype, KVLayout
from tiercache.testing.daemon import DaemonProcess
from tiercache.tiers.base import TierLevel

NS = Namespace(model_id="watch-test", revision="", layout=KVLayout(2, 2, 64, KVDtype.FLOAT32, 32, 32))
WAIT_S = 30.0


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    d = connector_daemon(tmp_path)
    try:
        d.start()
        yield d
    finally:
        d.cleanup()


def _store(address: str, tokens: list[int]) -> list[bytes]:
    keys = chunk_keys(NS, tokens)
    with TierCacheClient.connect(address) as client:
        grant = client.begin_store(NS, keys)
        assert client.commit_store(NS, grant.ticket_id) == len(keys)
    return keys


def _next(events: queue.Queue[WatchedEvent], kind: WatchedKind, key: bytes = b"") -> WatchedEvent:
    """The next event of ``kind`` (for ``key``, when given), skipping others (write-downs, promotions)."""
    while True:
        event = events.get(timeout=WAIT_S)
        if event.kind is kind and (not key or event.key == key):
            return event


def test_events_arrive_and_the_watch_resumes_after_a_daemon_restart(daemon: DaemonProcess) -> None:
    events: queue.Queue[WatchedEvent] = queue.Queue()
    watch = EventWatch(parse_address(daemon.address), None, ChannelConfig(), events.put).start()
    try:
        assert watch.wait_live(WAIT_S)
        (key,) = _store(daemon.address, list(range(32)))
        stored = _next(events, WatchedKind.STORED, key)
        assert stored.tier is TierLevel.L2 and stored.handle and stored.source is None

        daemon.restart()
        resync = _next(events, WatchedKind.RESYNC)  # subscribed again, from the old epoch's resume point
        assert resync.tier is None and resync.key == b""
        (after,) = _store(daemon.address, list(range(100, 132)))
        assert _next(events, WatchedKind.STORED, after).tier is TierLevel.L2
    finally:
        watch.close()
    assert not watch._thread.is_alive()
