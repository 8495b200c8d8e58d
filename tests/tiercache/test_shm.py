"""Shared-memory segments and the L2 tier's lifecycle: cross-process mapping, unlink, stale cleanup, pinning."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
import torch

from tiercache.errors import InvalidArgumentError, NotFoundError
from tiercache.shm import SHM_DIR, SharedSegment, clean_stale_segments
from tiercache.tiers.host import HostTier, HostTierConfig


@pytest.fixture
def prefix(request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"tiercache-t{abs(hash(request.node.nodeid)) % 10**8}"
    yield name
    for path in SHM_DIR.glob(f"{name}.*"):
        path.unlink()


def test_another_process_maps_the_segment_by_name(prefix: str) -> None:
    tier = HostTier(HostTierConfig(capacity_bytes=4 * 4096, slot_bytes=4096, segment_prefix=prefix))
    try:
        (slot,) = tier.reserve([b"k" * 48], [4096])
        slot.buffer.copy_(torch.arange(4096, dtype=torch.int64).to(torch.uint8))
        tier.commit([slot])
        index = tier.slot_of(b"k" * 48)
        code = textwrap.dedent(
            f"""
            from tiercache.shm import SharedSegment
            seg = SharedSegment.attach({tier.segment_name!r})
            view = seg.buffer[{index} * 4096 : {index} * 4096 + 4096]
            assert bytes(view) == bytes(i % 256 for i in range(4096))
            view[0] = 77  # writes by an attached engine land in the daemon's slot
            view.release()
            seg.close()
            """
        )
        subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
        assert int(tier.view(b"k" * 48)[0]) == 77  # type: ignore[index]
    finally:
        tier.close()
    assert not (SHM_DIR / tier.segment_name).exists()


def test_close_unlinks_and_is_idempotent(prefix: str) -> None:
    tier = HostTier(HostTierConfig(capacity_bytes=8192, slot_bytes=4096, segment_prefix=prefix))
    name = tier.segment_name
    assert (SHM_DIR / name).exists() and name.startswith(prefix + ".")
    tier.close()
    tier.close()
    assert not (SHM_DIR / name).exists()
    with pytest.raises(NotFoundError, match="name"):
        SharedSegment.attach(name)


def test_segments_of_a_dead_owner_are_cleaned_at_start(prefix: str) -> None:
    code = textwrap.dedent(
        f"""
        import os
        from tiercache.tiers.host import HostTier, HostTierConfig
        tier = HostTier(HostTierConfig(capacity_bytes=8192, slot_bytes=4096, segment_prefix={prefix!r}))
        print(tier.segment_name, flush=True)
        os._exit(0)  # crash: no close, no unlink
        """
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60)
    stale = out.stdout.strip()
    assert (SHM_DIR / stale).exists()
    tier = HostTier(HostTierConfig(capacity_bytes=8192, slot_bytes=4096, segment_prefix=prefix))
    try:
        assert not (SHM_DIR / stale).exists()
        assert (SHM_DIR / tier.segment_name).exists()
        assert clean_stale_segments(prefix) == []  # a live owner's segment is never touched
        assert (SHM_DIR / tier.segment_name).exists()
    finally:
        tier.close()


def test_bad_names_and_sizes() -> None:
    with pytest.raises(InvalidArgumentError, match="prefix"):
        SharedSegment.create("../etc", 4096)
    with pytest.raises(InvalidArgumentError, match="size"):
        SharedSegment.create("tiercache-x", 0)
    with pytest.raises(InvalidArgumentError, match="name"):
        SharedSegment.attach("a/b")


@pytest.mark.gpu
def test_l2_is_pinned_and_l1_lives_in_hbm_when_cuda_is_present(prefix: str) -> None:
    from tiercache.tiers.hbm import HbmTier, HbmTierConfig

    l2 = HostTier(HostTierConfig(capacity_bytes=4 * 4096, slot_bytes=4096, segment_prefix=prefix))
    l1 = HbmTier(HbmTierConfig(capacity_bytes=4 * 4096, slot_bytes=4096, device="cuda"))
    try:
        assert l2.pinned and l1.device.type == "cuda"
        data = torch.randint(0, 256, (4096,), dtype=torch.uint8)
        (slot,) = l2.reserve([b"p" * 48], [4096])
        slot.buffer.copy_(data)
        l2.commit([slot])
        (dev,) = l1.reserve([b"p" * 48], [4096])
        assert l2.read_into([b"p" * 48], [dev.buffer]) == [True]  # pinned host -> HBM
        l1.commit([dev])
        back = torch.zeros(4096, dtype=torch.uint8)
        assert l1.read_into([b"p" * 48], [back]) == [True]
        assert torch.equal(back, data)
    finally:
        l1.close()
        l2.close()
