"""The same-host data plane: slots of a daemon-owned segment as tensors (one by one, or a request's slots
as strided runs), unmapped only when unused."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
import torch

from tiercache.connector.results import SegmentInfo, SlotRef
from tiercache.connector.segments import SegmentMaps, SlotAccess, SlotMapping
from tiercache.errors import InvalidArgumentError, NotFoundError, TierCacheError, UnavailableError
from tiercache.shm import SHM_DIR, SharedSegment
from tiercache.testing.memory import resident_bytes


@pytest.fixture
def segment() -> Iterator[SharedSegment]:
    seg = SharedSegment.create(f"tiercache-cdp-{secrets.token_hex(3)}", 4 * 4096)
    yield seg
    seg.close()
    seg.unlink()


def _info(seg: SharedSegment, **kw: int) -> SegmentInfo:
    fields = {"slot_bytes": 4096, "num_slots": 4, "segment_bytes": 4 * 4096} | kw
    return SegmentInfo(seg.name, **fields)


def test_slot_views_share_memory_with_the_owner(segment: SharedSegment) -> None:
    mapping = SlotMapping.attach(_info(segment))
    with mapping.use() as slots:
        view = slots.view(SlotRef(index=0, slot=2, nbytes=100))
        assert view.dtype == torch.uint8 and view.shape == (100,)
        view.copy_(torch.arange(100, dtype=torch.uint8))
        assert bytes(segment.buffer[2 * 4096 : 2 * 4096 + 100]) == bytes(range(100))
        segment.buffer[3 * 4096] = 42
        assert int(slots.view(SlotRef(0, 3, 1))[0]) == 42
        with pytest.raises(TierCacheError, match="outside the segment"):
            slots.view(SlotRef(0, 4, 10))
        with pytest.raises(TierCacheError, match="outside the segment"):
            slots.view(SlotRef(0, 0, 4097))
    mapping.retire()


def test_runs_group_evenly_spaced_consecutive_chunks_and_hold_each_slots_bytes() -> None:
    slot, nbytes = 4096, 3000  # chunks shorter than their slot: a run strides over the gap
    memory = torch.arange(16 * slot, dtype=torch.int64).to(
        torch.uint8
    )  # the segment, every byte distinct-ish
    slots = SlotAccess(SegmentInfo("test", slot, 16, 16 * slot), memory)
    refs = [SlotRef(i, p, nbytes) for i, p in enumerate([3, 4, 5, 9, 10, 2, 11])]
    runs = slots.runs(refs)
    assert [(first, tuple(run.shape)) for first, run in runs] == [
        (0, (3, nbytes)),
        (3, (2, nbytes)),
        (5, (2, nbytes)),  # slots 2 and 11: evenly spaced too
    ]
    for first, run in runs:
        for i in range(run.shape[0]):
            view = slots.view(refs[first + i])
            assert run[i].data_ptr() == view.data_ptr() and torch.equal(run[i], view)
    # A gap in the chunk indices, another size, or a step back ends a run even where slots are consecutive.
    assert [first for first, _ in slots.runs([SlotRef(0, 3, nbytes), SlotRef(5, 4, nbytes)])] == [0, 5]
    assert len(slots.runs([SlotRef(0, 3, nbytes), SlotRef(1, 4, nbytes - 1)])) == 2
    assert len(slots.runs([SlotRef(0, 4, nbytes), SlotRef(1, 3, nbytes)])) == 2
    assert slots.runs([]) == []
    ((_, one),) = slots.runs([SlotRef(7, 15, nbytes)])
    assert one.shape == (1, nbytes) and torch.equal(one[0], slots.view(SlotRef(7, 15, nbytes)))


def test_runs_refuse_a_slot_outside_the_segment_anywhere_in_a_run() -> None:
    memory = torch.zeros(4 * 4096, dtype=torch.uint8)
    slots = SlotAccess(SegmentInfo("test", 4096, 4, 4 * 4096), memory)
    with pytest.raises(TierCacheError, match="outside the segment"):
        slots.runs([SlotRef(0, 2, 100), SlotRef(1, 3, 100), SlotRef(2, 4, 100)])
    with pytest.raises(TierCacheError, match="outside the segment"):
        slots.runs([SlotRef(0, 0, 4097)])


def test_retire_waits_for_active_users(segment: SharedSegment) -> None:
    mapping = SlotMapping.attach(_info(segment))
    with mapping.use() as slots:
        mapping.retire()
        slots.view(SlotRef(0, 1, 8)).fill_(7)  # still mapped: a user is active
    assert bytes(segment.buffer[4096:4104]) == b"\x07" * 8
    with pytest.raises(UnavailableError, match="retired"), mapping.use():
        pass
    mapping.retire()  # idempotent


def test_prefault_maps_a_named_segments_pages_in_and_writes_nothing() -> None:
    size = 64 * 4096
    owner = SharedSegment.create(f"tiercache-pf-{secrets.token_hex(3)}", size)
    try:
        owner.buffer[:] = bytes(range(256)) * (size // 256)
        mapping = SlotMapping.attach(SegmentInfo(owner.name, 4096, 64, size))
        with mapping.use() as slots:
            address = slots.view(SlotRef(0, 0, 1)).data_ptr()
        assert resident_bytes(address) == 0  # a fresh mapping of another's pages: a fault per page
        assert mapping.prefault() == size
        assert resident_bytes(address) == size
        assert bytes(owner.buffer) == bytes(range(256)) * (size // 256)
        assert mapping.prefault(max_bytes=3 * 4096) == 3 * 4096  # capped
        mapping.retire()
        assert mapping.prefault() == 0  # retired: nothing left to map
    finally:
        owner.close()
        owner.unlink()


def test_prefault_leaves_a_descriptors_sparse_pool_alone() -> None:
    pool = SharedSegment.create_anonymous("tiercache-pf-pool", 16 * 4096)
    info = SegmentInfo(pool.name, 4096, 16, 16 * 4096, fd_socket="/run/nowhere.sock")
    mapping = SlotMapping(pool, info)
    with mapping.use() as slots:
        address = slots.view(SlotRef(0, 0, 1)).data_ptr()
    assert mapping.prefault() == 0
    assert resident_bytes(address) == 0  # mapping it in would have allocated every page
    mapping.retire()


def test_attach_failures(segment: SharedSegment) -> None:
    with pytest.raises(NotFoundError):
        SlotMapping.attach(SegmentInfo(f"tiercache-none-{secrets.token_hex(3)}", 4096, 1, 4096))
    with pytest.raises(InvalidArgumentError, match="data_plane"):
        SlotMapping.attach(_info(segment, num_slots=5))
    with pytest.raises(InvalidArgumentError, match="data_plane"):
        SlotMapping.attach(_info(segment, num_slots=8, segment_bytes=8 * 4096))
    assert (SHM_DIR / segment.name).exists()  # attaching never unlinks the owner's segment


def test_segment_maps_map_once_per_name_and_retire_what_is_no_longer_named(segment: SharedSegment) -> None:
    maps = SegmentMaps()
    first = maps.mapping(_info(segment))
    assert first is not None and maps.mapping(_info(segment)) is first
    missing = SegmentInfo(f"tiercache-none-{secrets.token_hex(3)}", 4096, 1, 4096)
    assert maps.mapping(missing) is None  # not on this host: the byte stream is the data plane
    maps.retain(frozenset({segment.name}))
    with first.use():
        pass  # still named: still mapped
    maps.retain(frozenset())
    with pytest.raises(UnavailableError, match="retired"), first.use():
        pass
    again = maps.mapping(_info(segment))
    assert again is not None and again is not first
    maps.close()
    with pytest.raises(UnavailableError, match="retired"), again.use():
        pass
