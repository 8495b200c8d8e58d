"""Pages in the slot tiers: a chunk takes a run of pages, so a mix of chunk sizes fills L1 / L2."""

from __future__ import annotations

import logging
import random
import secrets
from collections.abc import Iterator

import pytest
import torch

from tiercache.errors import CapacityError, InvalidArgumentError
from tiercache.tiers.base import SlotTier
from tiercache.tiers.hbm import HbmTier, HbmTierConfig
from tiercache.tiers.host import HostTier, HostTierConfig

PAGE = 4096
SLOT = 64 * PAGE
NS_A, NS_B = b"a" * 16, b"b" * 16


def _host(capacity: int, page: int = PAGE, slot: int = SLOT) -> HostTier:
    return HostTier(
        HostTierConfig(
            capacity_bytes=capacity,
            slot_bytes=slot,
            page_bytes=page,
            segment_prefix=f"tc-pages-{secrets.token_hex(3)}",
            prefault=False,
        )
    )


@pytest.fixture(params=["L1", "L2"])
def tier(request: pytest.FixtureRequest) -> Iterator[SlotTier]:
    if request.param == "L1":
        t: SlotTier = HbmTier(
            HbmTierConfig(capacity_bytes=256 * PAGE, slot_bytes=SLOT, device="cpu", page_bytes=PAGE)
        )
    else:
        t = _host(256 * PAGE)
    yield t
    t.close()


def _data(cid: bytes, nbytes: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(int.from_bytes(cid[-4:], "little"))
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen)


def _cid(i: int, ns: bytes = NS_A) -> bytes:
    return ns + i.to_bytes(32, "little")


def _store(tier: SlotTier, cid: bytes, nbytes: int) -> None:
    (ws,) = tier.reserve([cid], [nbytes])
    ws.buffer.copy_(_data(cid, nbytes))
    tier.commit([ws])


def _read(tier: SlotTier, cid: bytes, nbytes: int) -> torch.Tensor | None:
    out = torch.empty(nbytes, dtype=torch.uint8)
    return out if tier.read_into([cid], [out]) == [True] else None


def _fill(tier: SlotTier, sizes: Iterator[int], start: int = 0) -> dict[bytes, int]:
    """Store chunks of the given sizes until the tier refuses one; returns what it holds."""
    held = {}
    for i, nbytes in enumerate(sizes, start):
        try:
            _store(tier, _cid(i), nbytes)
        except CapacityError:
            return held
        held[_cid(i)] = nbytes
    return held


def _mixed_sizes(seed: int) -> Iterator[int]:
    rng = random.Random(seed)
    while True:
        yield rng.choice([rng.randint(PAGE // 2, 3 * PAGE), rng.randint(8 * PAGE, SLOT)])


def test_a_mix_of_chunk_sizes_fills_the_tier(tier: SlotTier) -> None:
    held = _fill(tier, _mixed_sizes(1))
    usage = tier.usage()
    assert usage.payload_bytes == sum(held.values()) and usage.chunks == len(held)
    assert usage.payload_bytes >= 0.9 * usage.capacity_bytes
    assert usage.used_bytes == sum(tier.charge(n) for n in held.values())
    for cid, nbytes in held.items():  # bit-exact, every chunk in its own run
        got = _read(tier, cid, nbytes)
        assert got is not None and torch.equal(got, _data(cid, nbytes))
        view = tier.view(cid)
        assert view is not None and torch.equal(view, _data(cid, nbytes))


def test_one_page_per_chunk_wastes_what_pages_save() -> None:
    whole = _host(256 * PAGE, page=SLOT)  # the slots of before: one 64-page slot per chunk
    try:
        _fill(whole, _mixed_sizes(1))
        usage = whole.usage()
        assert usage.used_bytes == usage.chunks * SLOT and usage.payload_bytes < 0.7 * usage.capacity_bytes
    finally:
        whole.close()


def test_chunks_start_at_their_first_page(tier: SlotTier) -> None:
    _store(tier, _cid(0), 3 * PAGE + 1)  # four pages
    _store(tier, _cid(1), 10)
    assert tier.slot_of(_cid(0)) == 0 and tier.slot_of(_cid(1)) == 4
    assert tier.charge(3 * PAGE + 1) == 4 * PAGE and tier.charge(10) == PAGE
    with pytest.raises(InvalidArgumentError, match="nbytes"):
        tier.charge(SLOT + 1)


def test_evicted_runs_merge_for_the_next_store(tier: SlotTier) -> None:
    held = _fill(tier, iter([8 * PAGE] * 64))
    assert len(held) == 32 and tier.usage().free_bytes == 0
    first, second = tier.slot_of(_cid(4)), tier.slot_of(_cid(5))
    assert (first, second) == (32, 40)
    with pytest.raises(CapacityError):
        tier.reserve([_cid(100)], [16 * PAGE])
    assert tier.delete([_cid(4), _cid(5)]) == 2  # neighbours: one free run of 16 pages
    _store(tier, _cid(100), 16 * PAGE)
    assert tier.slot_of(_cid(100)) == 32
    got = _read(tier, _cid(100), 16 * PAGE)
    assert got is not None and torch.equal(got, _data(_cid(100), 16 * PAGE))


def test_free_pages_in_short_runs_do_not_hold_a_long_chunk(tier: SlotTier) -> None:
    _fill(tier, iter([PAGE] * 256))
    assert tier.delete([_cid(i) for i in range(0, 256, 2)]) == 128  # every other page
    assert tier.usage().free_bytes == 128 * PAGE
    with pytest.raises(CapacityError, match="run"):
        tier.reserve([_cid(300)], [2 * PAGE])  # no two free pages in a row
    assert tier.usage().reserved_bytes == 0
    assert tier.delete([_cid(1)]) == 1  # pages 0-2 are free now
    _store(tier, _cid(300), 3 * PAGE)
    assert tier.slot_of(_cid(300)) == 0


def test_a_batch_that_does_not_fit_reserves_nothing(tier: SlotTier) -> None:
    _fill(tier, iter([PAGE] * 256))
    tier.delete([_cid(i) for i in (0, 1, 5, 6)])
    with pytest.raises(CapacityError):
        tier.reserve([_cid(300), _cid(301), _cid(302)], [2 * PAGE, 2 * PAGE, PAGE])
    assert tier.usage().reserved_bytes == 0 and tier.usage().free_bytes == 4 * PAGE
    slots = tier.reserve([_cid(300), _cid(301)], [2 * PAGE, 2 * PAGE])
    assert sorted(ws.slot for ws in slots if ws.slot is not None) == [0, 5]


def test_quarantined_runs_come_back_whole() -> None:
    tier = _host(16 * PAGE, slot=16 * PAGE)
    try:
        slots = tier.reserve([_cid(0), _cid(1)], [5 * PAGE, 11 * PAGE])
        tier.quarantine(slots, until=10.0)
        assert tier.usage().reserved_bytes == 16 * PAGE
        assert tier.release_quarantined(10.0) == 2
        assert tier.usage().free_bytes == 16 * PAGE
        _store(tier, _cid(2), 16 * PAGE)
    finally:
        tier.close()


def test_tenant_pools_take_page_runs_from_the_shared_budget() -> None:
    tier = _host(8 * PAGE, slot=8 * PAGE)
    try:
        tier.assign(NS_A, "team-a")
        tier.assign(NS_B, "team-b")
        for i in range(4):
            _store(tier, _cid(i), PAGE)  # A's pages 0-3, memory from the default pool's free pages
        assert [tier.slot_of(_cid(i)) for i in range(4)] == [0, 1, 2, 3]
        tier.delete([_cid(0), _cid(2), _cid(3)])
        # A's free pages: 0 and 2-3 with memory, 4-7 without; a run of 5 needs both kinds merged
        big = _cid(9)
        _store(tier, big, 5 * PAGE)
        assert tier.slot_of(big) == 2
        got = _read(tier, big, 5 * PAGE)
        assert got is not None and torch.equal(got, _data(big, 5 * PAGE))
        usage = tier.usage()
        assert usage.used_bytes == 6 * PAGE and usage.free_bytes == 2 * PAGE
        _store(tier, _cid(20, NS_B), 2 * PAGE)  # B gets the last two pages' memory
        with pytest.raises(CapacityError):
            tier.reserve([_cid(21, NS_B)], [PAGE])
        b_slot = tier.slot_of(_cid(20, NS_B))
        assert b_slot is not None
        b_mem = tier.segment_of("team-b").buffer
        assert bytes(b_mem[b_slot * PAGE : (b_slot + 2) * PAGE]) == bytes(
            _data(_cid(20, NS_B), 2 * PAGE).numpy()
        )
        assert tier.read_into([_cid(1)], [torch.empty(PAGE, dtype=torch.uint8)]) == [True]
    finally:
        tier.close()


def test_a_full_tier_of_small_chunks_in_large_pages_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    tier = _host(8 * SLOT, page=SLOT)
    try:
        with caplog.at_level(logging.WARNING, logger="tiercache.tiers.pages"):
            _fill(tier, iter([PAGE] * 9))
        warnings = [r for r in caplog.records if "page size" in r.getMessage()]
        assert len(warnings) == 1 and "L2" in warnings[0].getMessage()
        assert tier.usage().payload_bytes == 8 * PAGE
    finally:
        tier.close()


def test_a_full_tier_that_its_chunks_fill_does_not_warn(caplog: pytest.LogCaptureFixture) -> None:
    tier = _host(64 * PAGE)
    try:
        with caplog.at_level(logging.WARNING, logger="tiercache.tiers.pages"):
            _fill(tier, iter([PAGE - 100] * 65))
        assert tier.usage().free_bytes == 0
        assert not [r for r in caplog.records if "page size" in r.getMessage()]
    finally:
        tier.close()


def test_page_sizes_are_checked() -> None:
    with pytest.raises(InvalidArgumentError, match="page_bytes"):
        _host(4 * SLOT, page=2 * SLOT)
    with pytest.raises(InvalidArgumentError, match="page_bytes"):
        _host(4 * SLOT, page=-1)


def test_a_tenant_pool_gives_back_its_own_short_runs_for_a_fresh_long_one() -> None:
    tier = _host(8 * PAGE, slot=8 * PAGE)
    try:
        tier.assign(NS_A, "team-a")
        tier.assign(NS_B, "team-b")
        for i in range(4):
            _store(tier, _cid(i), PAGE)  # A: pages 0-3
            _store(tier, _cid(10 + i, NS_B), PAGE)  # B: the rest of the memory
        tier.delete([_cid(0), _cid(2)])  # A's free memory: pages 0 and 2, no two in a row
        _store(tier, _cid(9), 2 * PAGE)  # fresh pages 4-5, with the memory of pages 0 and 2
        assert tier.slot_of(_cid(9)) == 4 and tier.usage().free_bytes == 0
        got = _read(tier, _cid(9), 2 * PAGE)
        assert got is not None and torch.equal(got, _data(_cid(9), 2 * PAGE))
        assert bytes(tier.segment_of("team-a").buffer[0:PAGE]) == bytes(PAGE)  # page 0's memory went back
    finally:
        tier.close()
