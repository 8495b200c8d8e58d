"""Tenant pools of the L2 tier: separate anonymous segments that share the tier's capacity."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
import torch

from tiercache.errors import CapacityError
from tiercache.shm import SHM_DIR
from tiercache.tiers.host import HostTier, HostTierConfig

SLOT = 4096
NS_A, NS_B = b"a" * 16, b"b" * 16


@pytest.fixture
def tier() -> Iterator[HostTier]:
    t = HostTier(
        HostTierConfig(
            capacity_bytes=2 * SLOT, slot_bytes=SLOT, segment_prefix=f"tc-part-{secrets.token_hex(3)}"
        )
    )
    t.assign(NS_A, "team-a")
    t.assign(NS_B, "team-b")
    yield t
    t.close()


def _store(tier: HostTier, cid: bytes, fill: int) -> None:
    (ws,) = tier.reserve([cid], [SLOT])
    ws.buffer.fill_(fill)
    tier.commit([ws])


def test_each_tenant_has_its_own_nameless_segment(tier: HostTier) -> None:
    a, b = tier.segment_of("team-a"), tier.segment_of("team-b")
    assert a is not b and a.name.startswith("memfd:") and b.name.startswith("memfd:")
    assert a.fd != b.fd
    assert not (SHM_DIR / a.name.removeprefix("memfd:")).exists()
    _store(tier, NS_A + b"k" * 32, 0x5A)
    _store(tier, NS_B + b"k" * 32, 0x11)  # the same key in another tenant: a second chunk, in B's pool
    slot_a = tier.slot_of(NS_A + b"k" * 32)
    assert slot_a is not None
    assert bytes(a.buffer[slot_a * SLOT : (slot_a + 1) * SLOT]) == b"\x5a" * SLOT
    assert b"\x5a" not in bytes(b.buffer)  # nothing of A's reaches B's memory
    assert b"\x5a" not in bytes(tier.segment_of("").buffer)  # nor the default pool


def test_tenant_pools_share_the_tier_capacity(tier: HostTier) -> None:
    _store(tier, NS_A + b"1" * 32, 1)
    _store(tier, NS_A + b"2" * 32, 2)
    with pytest.raises(CapacityError):
        tier.reserve([NS_B + b"1" * 32], [SLOT])  # two slots in all, both A's
    assert tier.delete([NS_A + b"1" * 32]) == 1
    _store(tier, NS_B + b"1" * 32, 3)  # B's fresh row takes the pages A's free row gave back
    usage = tier.usage()
    assert usage.chunks == 2 and usage.free_bytes == 0
    got = torch.empty(SLOT, dtype=torch.uint8)
    assert tier.read_into([NS_A + b"2" * 32], [got]) == [True] and int(got[0]) == 2
    assert tier.read_into([NS_B + b"1" * 32], [got]) == [True] and int(got[0]) == 3


def test_flipped_bytes_in_a_tenant_pool_fail_the_check(tier: HostTier) -> None:
    cid = NS_B + b"z" * 32
    _store(tier, cid, 7)
    slot = tier.slot_of(cid)
    assert slot is not None and tier.verify(cid)
    tier.segment_of("team-b").buffer[slot * SLOT + 100] = 8  # as a stray engine of B would
    assert not tier.verify(cid)
    assert tier.contains([cid]) == [False] and tier.usage().corrupt_reads == 1


def test_a_partitions_array_is_its_memory(tier: HostTier) -> None:
    """The per-chunk copies go through the array of a partition: it must be the partition's memory, for
    the default partition and for a tenant's, made on first use."""
    _store(tier, b"\x01" * 40, 7)
    space = tier._space  # internal to the tier
    partitions = space.keys()
    for key in partitions:
        flat, array = space.flat(key), space.array(key)
        assert array.ctypes.data == flat.data_ptr() and array.nbytes == flat.numel()
        assert space.array(key) is array  # made once
