"""A byte-stream store's requests are out of gRPC's hands once ``stream_store`` returns (real daemon).

gRPC pulls a client stream's requests on a daemon thread of its own. A stream that ended early (here: its
deadline) used to return while that thread was still inside the engine's payload code, and it stayed there
after the caller went on; a daemon thread inside a torch op when the interpreter exits aborts the process
("terminate called without an active exception", the demo's exit -6). Now the call returns only once the
pull in progress is over, and the requests are closed on the caller's thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tiercache.connector import ClientConfig, TierCacheClient
from tiercache.errors import DeadlineExceededError
from tiercache.keys import Namespace
from tiercache.layout import KVDtype, KVLayout
from tiercache.proto import tiercache_pb2 as pb
from tiercache.wire.framing import Framed

Daemon = Any  # tests/connector/conftest.py:Daemon

NAMESPACE = Namespace("test/stream-feed", "r1", KVLayout(2, 2, 8, KVDtype.FLOAT32, 16, 16))
SLOW_PULL_S = 1.0
"""How long the engine's first payload takes: far past the stream's deadline."""


def _client(daemon: Daemon, stream_timeout_s: float = 30.0) -> TierCacheClient:
    return TierCacheClient.connect(
        daemon.address, config=ClientConfig(timeout_s=10.0, stream_timeout_s=stream_timeout_s)
    )


def test_a_stream_that_ends_early_waits_for_the_pull_and_closes_the_requests_here(
    shared_daemon: Daemon,
) -> None:
    order: list[str] = []
    closed_on: list[threading.Thread] = []

    def messages(handle: bytes) -> Iterator[Framed[pb.StreamStoreMessage]]:
        try:
            time.sleep(SLOW_PULL_S)  # a slow gather out of the engine's tensors
            order.append("pull over")
            yield Framed(pb.StreamStoreMessage(), b"")  # never sent: the deadline has passed
            order.append("pulled again")
        finally:
            closed_on.append(threading.current_thread())

    with _client(shared_daemon, stream_timeout_s=0.2) as client:
        client.registration(NAMESPACE)
        with pytest.raises(DeadlineExceededError):
            client.stream_store(NAMESPACE, messages)
        order.append("stream_store over")
    assert order == ["pull over", "stream_store over"]
    assert closed_on == [threading.current_thread()]


def test_the_engines_own_exception_is_raised_as_is_and_its_requests_closed(shared_daemon: Daemon) -> None:
    closed_on: list[threading.Thread] = []

    def messages(handle: bytes) -> Iterator[Framed[pb.StreamStoreMessage]]:
        try:
            raise ValueError("the engine's payload failed")
            yield  # a generator
        finally:
            closed_on.append(threading.current_thread())

    failed = pytest.raises(ValueError, match="the engine's payload failed")
    with _client(shared_daemon) as client, failed:
        client.stream_store(NAMESPACE, messages)
    assert len(closed_on) == 1
