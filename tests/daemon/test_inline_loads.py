"""AcquireLoad's lease on the event loop (:func:`tiercache.daemon.loads.run_load_now`) over a real cache
(L2 in shared memory, L3 in LMDB): the same outcome as the executor's :func:`run_load` when it answers,
nothing done at all when it would have to wait."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tiercache.cache import CacheManager
from tiercache.daemon.convert import Usage
from tiercache.daemon.loads import INLINE_LOAD_KEYS, run_load, run_load_now
from tiercache.daemon.settle import Settled
from tiercache.keys import Namespace, chunk_keys
from tiercache.layout import KVDtype, KVLayout
from tiercache.policies.load import LoadPolicyKind, make_load_policy
from tiercache.tiers.base import TierLevel
from tiercache.tiers.host import HostTier, HostTierConfig
from tiercache.tiers.lmdb import LmdbTier, LmdbTierConfig
from tiercache.tiers.values import HEADER_BYTES

L2, L3 = TierLevel.L2, TierLevel.L3
LAYOUT = KVLayout(
    num_layers=2, num_kv_heads=2, head_dim=16, dtype=KVDtype.BFLOAT16, chunk_tokens=16, page_tokens=16
)
NS = Namespace("test/inline", "r1", LAYOUT)
WAIT_COMPLETE = make_load_policy(LoadPolicyKind.WAIT_COMPLETE).resolve(None, None)


@pytest.fixture
def cache(tmp_path: Path) -> Iterator[tuple[CacheManager, bytes]]:
    nbytes = LAYOUT.chunk_bytes
    l2 = HostTier(HostTierConfig(capacity_bytes=300 * nbytes, slot_bytes=nbytes, segment_prefix="tc-inline"))
    l3 = LmdbTier(LmdbTierConfig(path=str(tmp_path / "l3"), capacity_bytes=300 * (HEADER_BYTES + nbytes)))
    manager = CacheManager([l2, l3])
    try:
        yield manager, manager.register_namespace(NS)
    finally:
        manager.close()


def _put(manager: CacheManager, handle: bytes, keys: list[bytes]) -> None:
    payloads = [torch.full((LAYOUT.chunk_bytes,), i % 251, dtype=torch.uint8) for i in range(len(keys))]
    manager.put(handle, keys, payloads)
    manager.flush()


def _keys(n: int) -> list[bytes]:
    return chunk_keys(NS, list(range(n * LAYOUT.chunk_tokens)))


def test_a_prefix_in_l2_is_leased_at_once_as_the_executor_would(cache: tuple[CacheManager, bytes]) -> None:
    manager, handle = cache
    keys = _keys(6)
    _put(manager, handle, keys[:4])
    now = run_load_now(manager, handle, keys, L2, None, WAIT_COMPLETE)
    assert now is not None and now.ticket.lease_id and now.cached == 4
    assert [(c.index, c.key, c.source) for c in now.ticket.chunks] == [(i, keys[i], L2) for i in range(4)]
    assert all(int(c.view[0]) == i for i, c in enumerate(now.ticket.chunks))  # the chunks' own bytes
    later = run_load(manager, handle, keys, L2, None, WAIT_COMPLETE, None, 0.0)
    assert [(c.index, c.slot) for c in later.ticket.chunks] == [(c.index, c.slot) for c in now.ticket.chunks]
    assert later.cached == now.cached
    assert manager.release(now.ticket.lease_id) and manager.release(later.ticket.lease_id)


def test_a_settlement_is_applied_once_before_the_lease(cache: tuple[CacheManager, bytes]) -> None:
    manager, handle = cache
    keys = _keys(2)
    _put(manager, handle, keys)
    first = run_load_now(manager, handle, keys, L2, None, WAIT_COMPLETE)
    assert first is not None
    settled = Settled(handle, (first.ticket.lease_id,), Usage({}, {}, 0))
    second = run_load_now(manager, handle, keys, L2, None, WAIT_COMPLETE, settled)
    assert second is not None and len(second.ticket.chunks) == 2
    assert not manager.release(first.ticket.lease_id)  # the settlement ended it
    assert manager.release(second.ticket.lease_id)


def test_nothing_is_done_when_a_chunk_must_be_promoted(cache: tuple[CacheManager, bytes]) -> None:
    manager, handle = cache
    keys = _keys(3)
    _put(manager, handle, keys)
    manager.demote(handle, keys[1:2], L3)
    found = manager.lookup(handle, keys)
    assert found.chunks == 3 and found.by_tier[L2] == 1  # the second chunk is only in L3 now
    first = run_load_now(manager, handle, keys[:1], L2, None, WAIT_COMPLETE)
    assert first is not None
    settled = Settled(handle, (first.ticket.lease_id,), Usage({}, {}, 0))
    assert run_load_now(manager, handle, keys, L2, None, WAIT_COMPLETE, settled) is None
    assert manager.release(first.ticket.lease_id)  # the settlement was not applied either
    slow = run_load(manager, handle, keys, L2, None, WAIT_COMPLETE, None, 0.0)  # the executor's way
    assert len(slow.ticket.chunks) == 3 and slow.ticket.chunks[1].source == L3
    assert manager.release(slow.ticket.lease_id)


def test_nothing_is_done_while_another_thread_holds_the_index_or_for_a_long_chain(
    cache: tuple[CacheManager, bytes],
) -> None:
    manager, handle = cache
    keys = _keys(INLINE_LOAD_KEYS + 1)
    _put(manager, handle, keys)
    assert run_load_now(manager, handle, keys, L2, None, WAIT_COMPLETE) is None  # too long for the loop
    holding, done = threading.Event(), threading.Event()

    def hold() -> None:
        with manager.uncontended() as free:
            assert free
            holding.set()
            done.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(10)
        assert run_load_now(manager, handle, keys[:4], L2, None, WAIT_COMPLETE) is None
    finally:
        done.set()
        holder.join(10)
    now = run_load_now(manager, handle, keys[:4], L2, None, WAIT_COMPLETE)
    assert now is not None and len(now.ticket.chunks) == 4
    assert manager.release(now.ticket.lease_id)
