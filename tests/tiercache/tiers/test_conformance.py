"""One conformance suite for the tier protocol, run against L1 (CPU device), L2 (shared memory), L3 (LMDB)
and the shared tier (a real Redis Cluster started by ``conftest.shared_url``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiercache.errors import CapacityError, ConflictError, InvalidArgumentError
from tiercache.keys import CHUNK_ID_BYTES
from tiercache.tiers.base import SlotTier, StorageTier, TierLevel
from tiercache.tiers.hbm import HbmTier, HbmTierConfig
from tiercache.tiers.host import HostTier, HostTierConfig
from tiercache.tiers.lmdb import LmdbTier, LmdbTierConfig
from tiercache.tiers.shared import SharedTier, SharedTierConfig
from tiercache.tiers.values import HEADER_BYTES

SLOT = 4096
CHUNKS = 8


def make_tier(kind: str, tmp: Path, shared_url: str = "") -> StorageTier:
    if kind == "L1":
        return HbmTier(HbmTierConfig(capacity_bytes=CHUNKS * SLOT, slot_bytes=SLOT, device="cpu"))
    if kind == "L2":
        return HostTier(
            HostTierConfig(capacity_bytes=CHUNKS * SLOT, slot_bytes=SLOT, segment_prefix="tiercache-conf")
        )
    if kind == "SHARED":  # a key prefix of its own: every tier starts empty on the one cluster
        return SharedTier(
            SharedTierConfig(
                url=shared_url,
                capacity_bytes=CHUNKS * (SLOT + HEADER_BYTES),
                key_prefix=f"conf-{uuid.uuid4().hex}:",
            )
        )
    return LmdbTier(LmdbTierConfig(path=str(tmp / "l3"), capacity_bytes=CHUNKS * (SLOT + HEADER_BYTES)))


def _shared_url(kind: str, request: pytest.FixtureRequest) -> str:
    """The cluster's seed URL for the shared tier (the cluster starts only when a SHARED case runs)."""
    return str(request.getfixturevalue("shared_url")) if kind == "SHARED" else ""


@pytest.fixture(params=["L1", "L2", "L3", "SHARED"])
def tier(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StorageTier]:
    t = make_tier(request.param, tmp_path, _shared_url(request.param, request))
    yield t
    t.close()


def cid(i: int) -> bytes:
    return i.to_bytes(4, "little") * (CHUNK_ID_BYTES // 4)


def data(i: int, n: int = SLOT) -> torch.Tensor:
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(i))


def write(tier: StorageTier, ids: list[int], n: int = SLOT) -> None:
    slots = tier.reserve([cid(i) for i in ids], [n] * len(ids))
    for i, s in zip(ids, slots):
        assert s.buffer.numel() == n and s.buffer.dtype == torch.uint8
        s.buffer.copy_(data(i, n))
    tier.commit(slots)


def read(tier: StorageTier, i: int, n: int = SLOT) -> torch.Tensor | None:
    dst = torch.zeros(n, dtype=torch.uint8)
    return dst if tier.read_into([cid(i)], [dst])[0] else None


def test_round_trip_is_bit_exact(tier: StorageTier) -> None:
    write(tier, [1, 2, 3])
    for i in (1, 2, 3):
        got = read(tier, i)
        assert got is not None and torch.equal(got, data(i))
    assert tier.contains([cid(1), cid(9)]) == [True, False]
    usage = tier.usage()
    assert usage.chunks == 3 and usage.reserved_bytes == 0 and usage.used_bytes >= 3 * SLOT
    assert usage.payload_bytes == 3 * SLOT


def test_reserved_chunks_are_invisible_until_commit(tier: StorageTier) -> None:
    (slot,) = tier.reserve([cid(1)], [SLOT])
    slot.buffer.copy_(data(1))
    assert tier.contains([cid(1)]) == [False]
    assert read(tier, 1) is None
    assert tier.usage().reserved_bytes > 0
    tier.commit([slot])
    assert tier.usage().reserved_bytes == 0
    got = read(tier, 1)
    assert got is not None and torch.equal(got, data(1))
    with pytest.raises(ConflictError):
        tier.commit([slot])


def test_abort_frees_the_space(tier: StorageTier) -> None:
    slots = tier.reserve([cid(i) for i in range(CHUNKS)], [SLOT] * CHUNKS)
    with pytest.raises(CapacityError):
        tier.reserve([cid(99)], [SLOT])
    tier.abort(slots)
    tier.abort(slots)  # idempotent
    assert tier.usage().reserved_bytes == 0 and tier.contains([cid(0)]) == [False]
    write(tier, list(range(CHUNKS)))
    assert tier.usage().chunks == CHUNKS


def test_reserve_is_all_or_nothing(tier: StorageTier) -> None:
    write(tier, list(range(CHUNKS - 1)))
    with pytest.raises(CapacityError):
        tier.reserve([cid(100), cid(101)], [SLOT, SLOT])
    assert tier.usage().reserved_bytes == 0
    write(tier, [100])


def test_conflicts_and_bad_batches(tier: StorageTier) -> None:
    write(tier, [1])
    with pytest.raises(ConflictError):
        tier.reserve([cid(1)], [SLOT])
    pending = tier.reserve([cid(2)], [SLOT])
    with pytest.raises(ConflictError):
        tier.reserve([cid(2)], [SLOT])
    tier.abort(pending)
    with pytest.raises(InvalidArgumentError, match="sizes"):
        tier.reserve([cid(3), cid(4)], [SLOT])
    with pytest.raises(InvalidArgumentError, match="chunk_ids"):
        tier.reserve([cid(3), cid(3)], [SLOT, SLOT])
    with pytest.raises(InvalidArgumentError, match="sizes"):
        tier.reserve([cid(3)], [0])
    with pytest.raises(InvalidArgumentError, match="dsts"):
        tier.read_into([cid(1)], [torch.zeros(SLOT - 1, dtype=torch.uint8)])
    with pytest.raises(InvalidArgumentError, match="dsts"):
        tier.read_into([cid(1)], [torch.zeros(SLOT, dtype=torch.int32)])
    assert torch.equal(read(tier, 1), data(1))  # type: ignore[arg-type]


def test_delete_and_entries_order(tier: StorageTier) -> None:
    write(tier, [1, 2, 3])
    assert [c for c, _ in tier.entries()] == [cid(1), cid(2), cid(3)]
    read(tier, 1)
    assert [c for c, _ in tier.entries()] == [cid(2), cid(3), cid(1)]
    assert tier.delete([cid(2), cid(42)]) == 1
    assert tier.contains([cid(2)]) == [False] and tier.usage().chunks == 2
    assert tier.usage().payload_bytes == 2 * SLOT  # the chunks' own bytes, deleted ones gone
    assert dict(tier.entries())[cid(1)] == SLOT


def test_short_chunks_keep_their_length(tier: StorageTier) -> None:
    write(tier, [5], n=1000)
    assert dict(tier.entries())[cid(5)] == 1000
    got = read(tier, 5, n=1000)
    assert got is not None and torch.equal(got, data(5, 1000))


def test_level_and_slot_views(tier: StorageTier, request: pytest.FixtureRequest) -> None:
    assert tier.level in (TierLevel.L1, TierLevel.L2, TierLevel.L3, TierLevel.SHARED)
    assert tier.level == TierLevel[request.node.callspec.params["tier"]]
    write(tier, [7])
    if isinstance(tier, SlotTier):
        view = tier.view(cid(7))
        assert view is not None and torch.equal(view, data(7))
        assert tier.slot_of(cid(7)) is not None and tier.view(cid(8)) is None
    else:
        assert tier.level in (TierLevel.L3, TierLevel.SHARED)


@pytest.mark.parametrize("kind", ["L1", "L2", "L3", "SHARED"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.sampled_from(["put", "del", "read"]), st.integers(0, 11)), max_size=40))
def test_capacity_is_never_exceeded(
    kind: str,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
    ops: list[tuple[str, int]],
) -> None:
    tier = make_tier(kind, tmp_path_factory.mktemp("cap"), _shared_url(kind, request))
    present: set[int] = set()
    try:
        for op, i in ops:
            if op == "put" and i not in present:
                try:
                    write(tier, [i])
                    present.add(i)
                except CapacityError:
                    assert len(present) == CHUNKS
            elif op == "del":
                tier.delete([cid(i)])
                present.discard(i)
            else:
                got = read(tier, i)
                assert (got is not None) == (i in present)
                if got is not None:
                    assert torch.equal(got, data(i))
            u = tier.usage()
            assert u.used_bytes + u.reserved_bytes <= u.capacity_bytes
            assert u.chunks == len(present)
    finally:
        tier.close()


def test_a_freed_slot_is_reused(tmp_path: Path) -> None:
    tier = make_tier("L2", tmp_path)
    try:
        assert isinstance(tier, SlotTier)
        write(tier, list(range(CHUNKS)))
        tier.delete([cid(0)])
        write(tier, [50])  # takes the freed slot
        assert tier.usage().chunks == CHUNKS
        assert torch.equal(read(tier, 50), data(50))  # type: ignore[arg-type]
    finally:
        tier.close()


def test_commit_from_stores_the_sources_bytes(tier: StorageTier) -> None:
    slots = tier.reserve([cid(1), cid(2)], [SLOT, SLOT // 2])
    for s in slots:
        s.buffer.fill_(0xEE)  # whatever the slots hold, the sources' bytes are what is committed
    sources = [data(1), data(2, SLOT // 2)]
    tier.commit_from(slots, sources)
    assert torch.equal(read(tier, 1), sources[0])  # type: ignore[arg-type]
    assert torch.equal(read(tier, 2, SLOT // 2), sources[1])  # type: ignore[arg-type]
    assert tier.contains([cid(1), cid(2)]) == [True, True]


def test_commit_from_takes_known_checksums_and_never_serves_bytes_a_wrong_one_misdescribes(
    tier: StorageTier,
) -> None:
    slots = tier.reserve([cid(4), cid(5)], [SLOT, SLOT])
    right, wrong = xxhash.xxh3_64_intdigest(data(4).numpy().tobytes()), 12345
    tier.commit_from(slots, [data(4), data(5)], [right, wrong])
    assert torch.equal(read(tier, 4), data(4))  # type: ignore[arg-type]
    got = read(tier, 5)
    # A checked tier keeps the given checksum (its copy is not hashed again) and reports the value corrupt (a
    # miss); L1, unchecked, serves the right bytes. Never bytes other than the source's.
    assert got is None or torch.equal(got, data(5))
    assert (got is None) == (tier.level is not TierLevel.L1)


def test_commit_from_checks_its_sources(tier: StorageTier) -> None:
    (slot,) = tier.reserve([cid(3)], [SLOT])
    bad: tuple[list[torch.Tensor], ...] = (
        [],
        [data(3, SLOT - 1)],
        [data(3).view(torch.int8)],
        [data(3).reshape(2, -1)],
    )
    for srcs in bad:
        with pytest.raises(InvalidArgumentError, match="srcs"):
            tier.commit_from([slot], srcs)
    for checksums in ([], [None, None], [-1], [1 << 64], ["x"]):
        with pytest.raises(InvalidArgumentError, match="checksums"):
            tier.commit_from([slot], [data(3)], checksums)  # type: ignore[arg-type]
    assert tier.contains([cid(3)]) == [False]
    tier.commit_from([slot], [data(3)])  # still a live reservation after the refusals
    assert torch.equal(read(tier, 3), data(3))  # type: ignore[arg-type]
