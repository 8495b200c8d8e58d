"""CommitStore on the event loop (:mod:`tiercache.daemon.commits`) over a real cache (L2 in shared memory, L3
in LMDB): a small commit that nothing can make wait is made at once, exactly as the executor would; any other
is left alone (None, the ticket still open) for the executor."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tiercache.cache import CacheManager
from tiercache.daemon.commits import INLINE_COMMIT_BYTES, INLINE_COMMIT_CHUNKS, commit_now
from tiercache.keys import Namespace, chunk_keys
from tiercache.layout import KVDtype, KVLayout
from tiercache.tiers.base import TierLevel
from tiercache.tiers.host import HostTier, HostTierConfig
from tiercache.tiers.lmdb import LmdbTier, LmdbTierConfig
from tiercache.tiers.values import HEADER_BYTES

L2 = TierLevel.L2
LAYOUT = KVLayout(
    num_layers=2, num_kv_heads=2, head_dim=16, dtype=KVDtype.BFLOAT16, chunk_tokens=16, page_tokens=16
)
NS = Namespace("test/inline-commit", "r1", LAYOUT)
CB = LAYOUT.chunk_bytes
WAIT_S = 30.0


@pytest.fixture
def cache(tmp_path: Path) -> Iterator[tuple[CacheManager, bytes]]:
    l2 = HostTier(HostTierConfig(capacity_bytes=200 * CB, slot_bytes=CB, segment_prefix="tc-inline-commit"))
    l3 = LmdbTier(LmdbTierConfig(path=str(tmp_path / "l3"), capacity_bytes=200 * (HEADER_BYTES + CB)))
    manager = CacheManager([l2, l3])
    try:
        yield manager, manager.register_namespace(NS)
    finally:
        manager.close()


def _filled(manager: CacheManager, handle: bytes, n: int, seed: int) -> tuple[int, list[bytes]]:
    """A ticket of ``n`` chunks whose slots hold their bytes, as an engine leaves them before CommitStore."""
    keys = chunk_keys(NS, [seed * 7919 + i for i in range(n * LAYOUT.chunk_tokens)])
    ticket = manager.begin_store(handle, keys, level=L2)
    assert ticket.level == L2 and len(ticket.slots) == n
    for slot in ticket.slots:
        slot.buffer.fill_(slot.index % 251)
    return ticket.ticket_id, keys


def test_a_small_commit_is_made_at_once(cache: tuple[CacheManager, bytes]) -> None:
    manager, handle = cache
    ticket, keys = _filled(manager, handle, 3, seed=1)
    assert commit_now(manager, ticket, None, CB, quotas=False) == 3
    assert manager.lookup(handle, keys).by_tier[L2] == 3
    got = manager.get(handle, keys)  # copied out of L2: checked against the checksums taken at commit
    assert all(g is not None and int(g[0]) == i for i, g in enumerate(got))


def test_a_commit_of_some_positions_leaves_the_rest_open(cache: tuple[CacheManager, bytes]) -> None:
    manager, handle = cache
    ticket, keys = _filled(manager, handle, 3, seed=2)
    assert commit_now(manager, ticket, [1, 1], CB, quotas=False) == 1  # a position given twice counts once
    assert [manager.lookup(handle, [k]).chunks for k in keys] == [0, 1, 0]
    assert manager.commit_store(ticket) == 2


@pytest.mark.parametrize(
    ("chunks", "chunk_bytes", "quotas"),
    [
        (INLINE_COMMIT_CHUNKS + 1, CB, False),  # too many chunks to file on the loop
        (2, INLINE_COMMIT_BYTES // 2 + 1, False),  # too many bytes to hash on the loop
        (2, CB, True),  # a commit may trim a tenant with quotas, which may demote
    ],
)
def test_a_commit_that_is_large_or_may_wait_is_left_to_the_executor(
    cache: tuple[CacheManager, bytes], chunks: int, chunk_bytes: int, quotas: bool
) -> None:
    manager, handle = cache
    ticket, keys = _filled(manager, handle, chunks, seed=3)
    assert manager.open_store_chunks(ticket) == chunks
    assert commit_now(manager, ticket, None, chunk_bytes, quotas) is None
    assert manager.lookup(handle, keys).chunks == 0  # nothing done: the ticket is still open
    assert manager.commit_store(ticket) == chunks


def test_a_commit_of_a_ticket_that_is_not_open_is_left_to_the_executor(
    cache: tuple[CacheManager, bytes],
) -> None:
    manager, handle = cache
    ticket, _ = _filled(manager, handle, 1, seed=5)
    assert manager.commit_store(ticket) == 1
    assert manager.open_store_chunks(ticket) is None  # closed: the executor's commit reports it
    assert commit_now(manager, ticket, None, CB, quotas=False) is None
    assert commit_now(manager, 987_654_321, None, CB, quotas=False) is None  # never opened


def test_a_commit_is_left_to_the_executor_while_another_thread_holds_the_index(
    cache: tuple[CacheManager, bytes],
) -> None:
    manager, handle = cache
    ticket, keys = _filled(manager, handle, 2, seed=4)
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with manager.uncontended() as free:
            assert free
            held.set()
            assert done.wait(WAIT_S)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert held.wait(WAIT_S)
        assert commit_now(manager, ticket, None, CB, quotas=False) is None
    finally:
        done.set()
        thread.join(WAIT_S)
    assert manager.lookup(handle, keys).chunks == 0
    assert commit_now(manager, ticket, None, CB, quotas=False) == 2
