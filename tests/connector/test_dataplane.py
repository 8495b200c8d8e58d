"""The same-host data plane: slots of a daemon-owned segment as tensors, unmapped only when unused."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
import torch

from tiercache.connector.results import SegmentInfo, SlotRef
from tiercache.connector.segments import SegmentMaps, SlotMapping
from tiercache.errors import InvalidArgumentError, NotFoundError, TierCacheError, UnavailableError
from tiercache.shm import SHM_DIR, SharedSegment


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


def test_retire_waits_for_active_users(segment: SharedSegment) -> None:
    mapping = SlotMapping.attach(_info(segment))
    with mapping.use() as slots:
        mapping.retire()
        slots.view(SlotRef(0, 1, 8)).fill_(7)  # still mapped: a user is active
    assert bytes(segment.buffer[4096:4104]) == b"\x07" * 8
    with pytest.raises(UnavailableError, match="retired"), mapping.use():
        pass
    mapping.retire()  # idempotent


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
