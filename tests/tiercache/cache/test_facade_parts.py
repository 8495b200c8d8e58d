"""The small parts the manager facade delegates to: argument checks, namespace registry, listeners,
prefill claims against the index, and a store ticket's fill (aborted on failure)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import overload

import pytest
import torch

from tiercache.cache import CacheConfig, CacheManager, checks
from tiercache.cache.claims import PrefillClaims
from tiercache.cache.index import ChunkEntry, Index
from tiercache.cache.listeners import Listeners
from tiercache.cache.namespaces import Namespaces
from tiercache.cache.space import Space
from tiercache.errors import ConflictError, InvalidArgumentError, NotFoundError
from tiercache.keys import CHUNK_ID_BYTES, Namespace, chunk_keys
from tiercache.policies import LruPolicy
from tiercache.prefill import PrefillCoordinator
from tiercache.stats import ChunkEvent, EventKind
from tiercache.tiers.base import StorageTier, TierLevel
from tiercache.tiers.hbm import HbmTier, HbmTierConfig
from tiercache.tiers.host import HostTier, HostTierConfig
from tiercache.tiers.lmdb import LmdbTier, LmdbTierConfig

L1, L2, L3 = TierLevel.L1, TierLevel.L2, TierLevel.L3


# ---------------------------------------------------------------- checks


@pytest.mark.parametrize("value", [0, 7])
def test_count_accepts_non_negative_ints(value: int) -> None:
    assert checks.count(value, "start_depth") == value


@pytest.mark.parametrize("value", [-1, True, 1.0, "1", None])
def test_count_refuses_the_rest_naming_the_field(value: object) -> None:
    with pytest.raises(InvalidArgumentError, match=r"^start_depth: must be a non-negative integer, got"):
        checks.count(value, "start_depth")
    with pytest.raises(InvalidArgumentError, match=r"^effective_by_tier: token counts must be non-negative"):
        checks.count(value, "effective_by_tier", "token counts must be non-negative")


def test_seconds_accepts_numbers_as_floats_and_zero_only_when_not_positive() -> None:
    assert checks.seconds(0, "timeout_s") == 0.0 and isinstance(checks.seconds(2, "timeout_s"), float)
    assert checks.seconds(0.5, "ttl_s", positive=True) == 0.5
    with pytest.raises(InvalidArgumentError, match=r"^ttl_s: must be a positive number of seconds, got 0"):
        checks.seconds(0, "ttl_s", positive=True)


@pytest.mark.parametrize("value", [-0.1, float("nan"), True, "1", None])
def test_seconds_refuses_negatives_nan_bools_and_non_numbers(value: object) -> None:
    with pytest.raises(InvalidArgumentError, match=r"^timeout_s: must be a non-negative number of seconds"):
        checks.seconds(value, "timeout_s")
    with pytest.raises(InvalidArgumentError, match=r"^wait_s: must be None or a non-negative number, got"):
        checks.seconds(value, "wait_s", message="must be None or a non-negative number")


@pytest.fixture
def tiers(tmp_path: Path) -> Iterator[dict[TierLevel, StorageTier]]:
    """An L1 (on the CPU) with slots of the test layout's chunk size and an L3, fastest first."""
    made: dict[TierLevel, StorageTier] = {
        L1: HbmTier(HbmTierConfig(capacity_bytes=4 * 2048, slot_bytes=2048, device="cpu")),
        L3: LmdbTier(LmdbTierConfig(path=str(tmp_path / "l3"), capacity_bytes=1 << 20)),
    }
    yield made
    for tier in made.values():
        tier.close()


def test_levels_default_to_the_fastest_and_refuse_foreign_levels(tiers: dict[TierLevel, StorageTier]) -> None:
    assert checks.tier_level(tiers, None) is L1 and checks.tier_level(tiers, L3) is L3
    with pytest.raises(InvalidArgumentError, match=r"^level: .*L2.* is not a tier of this cache"):
        checks.tier_level(tiers, L2)
    with pytest.raises(InvalidArgumentError, match=r"^level:"):
        checks.tier_level(tiers, 1)  # type: ignore[arg-type]


def test_slot_levels_refuse_the_disk_tier(tiers: dict[TierLevel, StorageTier]) -> None:
    assert checks.slot_level(tiers, None) is L1 and checks.slot_level(tiers, L1) is L1
    with pytest.raises(InvalidArgumentError, match=r"^level: L3 has no slots to lease"):
        checks.slot_level(tiers, L3)
    with pytest.raises(InvalidArgumentError, match=r"^level: this cache has no slot tier"):
        checks.slot_level({L3: tiers[L3]}, None)


# ---------------------------------------------------------------- namespace registry


def _open() -> None:
    pass


def _closed() -> None:
    raise ConflictError("closed")


def test_registration_is_idempotent_and_scoped_by_tenant(
    tiers: dict[TierLevel, StorageTier], namespace: Namespace
) -> None:
    registry = Namespaces(threading.RLock(), tiers)
    a = registry.register(namespace, "a", _open)
    assert registry.register(namespace, "a", _open) == a and len(registry) == 1
    b = registry.register(namespace, "b", _open)
    assert b != a and len(registry) == 2
    assert registry.get(a) is namespace and registry.get(b) is namespace
    with pytest.raises(NotFoundError, match=r"^namespace_id:"):
        registry.get(b"\x00" * len(a))
    with pytest.raises(ConflictError):
        registry.register(namespace, "c", _closed)
    assert len(registry) == 2


def test_registration_refuses_what_does_not_fit_and_bad_arguments(
    tiers: dict[TierLevel, StorageTier], namespace: Namespace
) -> None:
    small = {L1: HbmTier(HbmTierConfig(capacity_bytes=64, slot_bytes=64, device="cpu"))}
    try:
        with pytest.raises(InvalidArgumentError, match=r"^layout: chunks of .* do not fit L1"):
            Namespaces(threading.RLock(), small).register(namespace, "", _open)
    finally:
        small[L1].close()
    registry = Namespaces(threading.RLock(), tiers)
    with pytest.raises(InvalidArgumentError, match=r"^namespace:"):
        registry.register("not a namespace", "", _open)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=r"^tenant:"):
        registry.register(namespace, 3, _open)  # type: ignore[arg-type]
    assert len(registry) == 0


def test_chunk_ids_are_namespace_scoped_and_checked(
    tiers: dict[TierLevel, StorageTier], namespace: Namespace
) -> None:
    registry = Namespaces(threading.RLock(), tiers)
    a, b = registry.register(namespace, "a", _open), registry.register(namespace, "b", _open)
    keys = chunk_keys(namespace, list(range(2 * namespace.layout.chunk_tokens)))
    ids_a, ids_b = registry.chunk_ids(a, keys), registry.chunk_ids(b, keys)
    assert len(ids_a) == 2 and all(len(c) == CHUNK_ID_BYTES for c in ids_a)
    assert set(ids_a).isdisjoint(ids_b)
    with pytest.raises(InvalidArgumentError, match=r"^keys: must be a sequence"):
        registry.chunk_ids(a, keys[0])
    with pytest.raises(InvalidArgumentError, match=r"^keys\[1\]:"):
        registry.chunk_ids(a, [keys[0], b"short"])
    with pytest.raises(NotFoundError, match=r"^namespace_id:"):
        registry.chunk_ids(b"\x01" * len(a), keys)


# ---------------------------------------------------------------- listeners


def _event(key: bytes) -> ChunkEvent:
    return ChunkEvent(EventKind.STORED, L1, b"n" * 16, key)


def test_listeners_run_in_order_a_failing_one_is_skipped_and_unsubscribe_is_idempotent() -> None:
    listeners = Listeners(threading.RLock())
    seen: list[tuple[str, bytes]] = []

    def broken(event: ChunkEvent) -> None:
        raise RuntimeError("listener bug")

    stop_first = listeners.add(lambda e: seen.append(("first", e.key)))
    listeners.add(broken)
    listeners.add(lambda e: seen.append(("last", e.key)))
    listeners.emit(_event(b"k1"))
    assert seen == [("first", b"k1"), ("last", b"k1")]
    stop_first()
    stop_first()
    listeners.emit(_event(b"k2"))
    assert seen[2:] == [("last", b"k2")]


# ---------------------------------------------------------------- prefill claims against the index


def _cid(i: int) -> bytes:
    return i.to_bytes(4, "big") * (CHUNK_ID_BYTES // 4)


def test_claims_count_the_cached_prefix_from_the_index() -> None:
    lock = threading.RLock()
    space = Space([L1], LruPolicy(), 0.0)
    index = Index([L1], space, lambda e: None)
    index.next_tick()
    index.add_residency(_cid(0), ChunkEntry(b"n" * 16, _cid(0), 0, 64), L1, 0.0)
    claims = PrefillClaims(lock, index, PrefillCoordinator(lambda: 0.0))
    first = claims.claim([_cid(0), _cid(1), _cid(2)], 10.0)
    assert (first.cached, first.wait, first.lead) == (1, 0, 2)
    second = claims.claim([_cid(0), _cid(1), _cid(2)], 10.0)
    assert (second.cached, second.wait, second.lead) == (1, 2, 0)
    assert claims.wait([_cid(0), _cid(1)], 0.0, 0) == 1  # nothing published: the timeout ends the wait


# ---------------------------------------------------------------- a store ticket's fill


class _FailsAt(Sequence[torch.Tensor]):
    """Payloads whose ``index``-th item cannot be read (the copy into the ticket fails half-way)."""

    def __init__(self, payloads: list[torch.Tensor], index: int) -> None:
        self._payloads = payloads
        self._index = index

    def __len__(self) -> int:
        return len(self._payloads)

    @overload
    def __getitem__(self, i: int) -> torch.Tensor: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[torch.Tensor]: ...
    def __getitem__(self, i: int | slice) -> torch.Tensor | Sequence[torch.Tensor]:
        if isinstance(i, int) and i == self._index:
            raise OSError("payload unreadable")
        return self._payloads[i]

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self._payloads)


def test_a_failed_put_aborts_its_ticket_at_once(namespace: Namespace) -> None:
    n = namespace.layout.chunk_bytes
    tier = HostTier(HostTierConfig(capacity_bytes=8 * n, slot_bytes=n, segment_prefix="tiercache-test-fill"))
    cache = CacheManager([tier], CacheConfig(lease_ttl_s=600.0, max_ttl_s=600.0))
    try:
        ns_id = cache.register_namespace(namespace)
        keys = chunk_keys(namespace, list(range(3 * namespace.layout.chunk_tokens)))
        payloads = [torch.full((n,), i, dtype=torch.uint8) for i in range(3)]
        with pytest.raises(OSError, match="payload unreadable"):
            cache.put(ns_id, keys, _FailsAt(payloads, 1))
        assert tier.usage().reserved_bytes == 0 and cache.lookup(ns_id, keys).chunks == 0
        assert cache.put(ns_id, keys, payloads) == 3  # nothing is left claimed by the failed ticket
    finally:
        cache.close()
