"""AcquireLoad's slot references, filled into the response in place (:func:`tiercache.daemon.convert.add_load_refs`)."""

from __future__ import annotations

from tiercache.cache import LoadChunk
from tiercache.daemon import convert
from tiercache.proto import tiercache_pb2 as pb
from tiercache.tiers.base import TierLevel


def _chunk(index: int, slot: int, source: TierLevel) -> LoadChunk:
    return LoadChunk(index, bytes([index]) * 32, slot, source, lambda: None)


def test_each_chunk_keeps_its_position_slot_and_source() -> None:
    chunks = [_chunk(0, 7, TierLevel.L2), _chunk(1, 3, TierLevel.L3), _chunk(2, 9, TierLevel.L2)]
    response = pb.AcquireLoadResponse(lease_id=4)
    convert.add_load_refs(response.slots, chunks, 4096)
    assert [(r.index, r.slot, r.nbytes, r.source) for r in response.slots] == [
        (0, 7, 4096, pb.TIER_L2),
        (1, 3, 4096, pb.TIER_L3),
        (2, 9, 4096, pb.TIER_L2),
    ]
    assert pb.AcquireLoadResponse.FromString(response.SerializeToString()) == response


def test_no_chunks_leave_the_response_without_slots() -> None:
    response = pb.AcquireLoadResponse()
    convert.add_load_refs(response.slots, [], 4096)
    assert not response.slots and response.SerializeToString() == b""
