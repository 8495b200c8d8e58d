"""TierCacheStorage loaded by SGLang's own factory, over real daemon processes and SGLang's real host pools:
one server stores pages, a second server (another backend, another pool) finds and loads them bit-exact;
other models and salts never hit; a daemon that is down is a miss, never an exception."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tiercache.testing.daemon import DaemonProcess
from tiercache.testing.sglang import (
    MISSING,
    PoolShape,
    attach,
    fill,
    host_pool,
    page_hashes,
    pages_of,
    storage_config,
)

pytest.importorskip("sglang.srt.mem_cache.storage.backend_factory", reason=MISSING)

from tiercache.connector import Medium
from tiercache.connector.sglang import TierCacheStorage

SHAPE = PoolShape()
PAGES = 5
LAYOUTS = ("page_first", "layer_first", "page_first_direct")


def _tokens(seed: int, pages: int = PAGES) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 32000, (pages * SHAPE.page,), generator=gen).tolist()


def _server(
    daemon: DaemonProcess, backends: list[Any], layout: str, mla: bool = False, tp_rank: int = 0, **extra: Any
) -> tuple[Any, Any]:
    """One SGLang server's pool and backend (``extra``: the extra config beyond address and factory keys)."""
    model = extra.pop("model_name", "test/tiny-model")
    extra.setdefault("timeout_s", 30)  # a loaded test machine: a slow call is not the miss a test looks for
    pool = host_pool(layout, SHAPE, mla=mla)
    config = storage_config(
        {"address": daemon.address, **extra}, layout, model=model, mla=mla, tp_rank=tp_rank,
        tp_size=2 if tp_rank else 1,
    )  # fmt: skip
    backend = attach(pool, config)
    backends.append(backend)
    return pool, backend


def _stored(pool: Any, backend: Any, keys: list[str], seed: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    slots = pool.alloc(len(keys) * SHAPE.page)
    fill(pool, slots, seed)
    assert backend.batch_set_v1(keys, slots) == [True] * len(keys)
    return slots, pages_of(pool, slots)


def test_factory_builds_the_backend(daemon: DaemonProcess, backends: list[Any]) -> None:
    _, backend = _server(daemon, backends, "page_first")
    assert isinstance(backend, TierCacheStorage)
    assert backend.identity.model_id == "test/tiny-model"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_second_server_loads_pages_bit_exact(daemon: DaemonProcess, backends: list[Any], layout: str) -> None:
    keys = page_hashes(_tokens(1), SHAPE.page)
    writer_pool, writer = _server(daemon, backends, layout)
    _, written = _stored(writer_pool, writer, keys, seed=7)

    reader_pool, reader = _server(daemon, backends, layout)
    assert reader.batch_exists(keys) == PAGES
    assert reader.batch_exists([*keys[:2], "not-a-stored-page", *keys[2:]]) == 2
    # the reader's pages sit elsewhere in its pool than the writer's did
    reader_pool.alloc(3 * SHAPE.page)
    slots = reader_pool.alloc(PAGES * SHAPE.page)
    assert reader.batch_get_v1(keys, slots) == [True] * PAGES
    for got, want in zip(pages_of(reader_pool, slots), written):
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    # pages the daemon holds already are skipped, and the write still succeeds
    assert reader.batch_set_v1(keys, slots) == [True] * PAGES


def test_clear_purges_this_servers_namespace_only(daemon: DaemonProcess, backends: list[Any]) -> None:
    keys = page_hashes(_tokens(9), SHAPE.page)
    pool, mine = _server(daemon, backends, "page_first")
    _stored(pool, mine, keys, seed=29)
    other_pool, other = _server(daemon, backends, "page_first", cache_salt="tenant-b")
    _stored(other_pool, other, keys, seed=31)
    assert mine.clear() is True
    assert mine.batch_exists(keys) == 0
    assert other.batch_exists(keys) == PAGES


def test_byte_stream_moves_the_same_pages(daemon: DaemonProcess, backends: list[Any]) -> None:
    keys = page_hashes(_tokens(8), SHAPE.page)
    writer_pool, writer = _server(daemon, backends, "page_first", data_plane="stream")
    _, written = _stored(writer_pool, writer, keys, seed=23)
    reader_pool, reader = _server(daemon, backends, "page_first", data_plane="stream")
    assert reader.data_plane().kind is Medium.BYTE_STREAM
    slots = reader_pool.alloc(PAGES * SHAPE.page)
    assert reader.batch_get_v1(keys, slots) == [True] * PAGES
    assert all(torch.equal(a, b) for a, b in zip(pages_of(reader_pool, slots), written))
    # the shared-memory plane of another server reads what the stream stored
    shm_pool, shm = _server(daemon, backends, "page_first")
    assert shm.data_plane().kind is Medium.SHARED_MEMORY
    shm_slots = shm_pool.alloc(PAGES * SHAPE.page)
    assert shm.batch_get_v1(keys, shm_slots) == [True] * PAGES
    assert all(torch.equal(a, b) for a, b in zip(pages_of(shm_pool, shm_slots), written))


def test_layer_first_and_page_first_direct_share_pages(daemon: DaemonProcess, backends: list[Any]) -> None:
    keys = page_hashes(_tokens(2), SHAPE.page)
    pool_a, a = _server(daemon, backends, "layer_first")
    _, written = _stored(pool_a, a, keys, seed=3)
    pool_b, b = _server(daemon, backends, "page_first_direct")
    slots = pool_b.alloc(PAGES * SHAPE.page)
    assert b.batch_get_v1(keys, slots) == [True] * PAGES
    for got, want in zip(pages_of(pool_b, slots), written):
        # the same K/V values, in each pool's own page order
        assert torch.equal(got.view(2, SHAPE.layers, -1), want.view(2, SHAPE.layers, -1))
    # a page_first pool orders a page's bytes otherwise: another namespace
    _, c = _server(daemon, backends, "page_first")
    assert c.batch_exists(keys) == 0


@pytest.mark.parametrize(
    ("other", "value"), [("model_name", "test/other-model"), ("cache_salt", "tenant-b"), ("revision", "r2")]
)
def test_other_model_or_salt_never_hits(
    daemon: DaemonProcess, backends: list[Any], other: str, value: str
) -> None:
    keys = page_hashes(_tokens(3), SHAPE.page)
    pool, writer = _server(daemon, backends, "page_first", cache_salt="tenant-a")
    _stored(pool, writer, keys, seed=5)
    _, same = _server(daemon, backends, "page_first", cache_salt="tenant-a")
    assert same.batch_exists(keys) == PAGES

    extra: dict[str, Any] = {"cache_salt": "tenant-a", other: value}
    other_pool, stranger = _server(daemon, backends, "page_first", **extra)
    assert stranger.batch_exists(keys) == 0
    slots = other_pool.alloc(PAGES * SHAPE.page)
    before = pages_of(other_pool, slots)
    assert stranger.batch_get_v1(keys, slots) == [False] * PAGES
    assert all(torch.equal(a, b) for a, b in zip(pages_of(other_pool, slots), before))


def test_legacy_calls_round_trip_and_meet_v1(daemon: DaemonProcess, backends: list[Any]) -> None:
    keys = page_hashes(_tokens(4), SHAPE.page)
    pool, backend = _server(daemon, backends, "layer_first")
    slots = pool.alloc(PAGES * SHAPE.page)
    fill(pool, slots, seed=11)
    written = pages_of(pool, slots)
    # SGLang's legacy write path: flat data pages
    assert backend.batch_set(
        keys[:3], [pool.get_data_page(s) for s in slots[: 3 * SHAPE.page : SHAPE.page].tolist()]
    )
    assert backend.set(keys[3], pool.get_data_page(int(slots[3 * SHAPE.page])))
    assert backend.exists(keys[3]) and not backend.exists(keys[4])

    reader_pool, reader = _server(daemon, backends, "layer_first")
    targets = [reader_pool.get_dummy_flat_data_page() for _ in keys]
    got = reader.batch_get(keys, targets)
    assert [g is not None for g in got] == [True, True, True, True, False]
    for i in range(4):
        assert got[i] is targets[i] and torch.equal(targets[i], written[i])
    assert reader.get(keys[4]) is None
    # the legacy pages are the pages the zero-copy calls move
    v1_slots = reader_pool.alloc(4 * SHAPE.page)
    assert reader.batch_get_v1(keys[:4], v1_slots) == [True] * 4
    assert all(torch.equal(a, b) for a, b in zip(pages_of(reader_pool, v1_slots), written[:4]))


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_mla_rank_zero_writes_and_every_rank_reads(
    daemon: DaemonProcess, backends: list[Any], layout: str
) -> None:
    keys = page_hashes(_tokens(5), SHAPE.page)
    pool_1, rank_1 = _server(daemon, backends, layout, mla=True, tp_rank=1)
    _stored(pool_1, rank_1, keys, seed=13)  # True: not this rank's to write ...
    assert rank_1.batch_exists(keys) == 0  # ... and nothing was written

    pool_0, rank_0 = _server(daemon, backends, layout, mla=True, tp_rank=0)
    _, written = _stored(pool_0, rank_0, keys, seed=17)
    assert rank_1.batch_exists(keys) == PAGES
    slots = pool_1.alloc(PAGES * SHAPE.page)
    assert rank_1.batch_get_v1(keys, slots) == [True] * PAGES
    assert all(torch.equal(a, b) for a, b in zip(pages_of(pool_1, slots), written))
    # the legacy calls move the same latent pages
    targets = [pool_1.get_dummy_flat_data_page() for _ in keys]
    assert all(got is not None for got in rank_1.batch_get(keys, targets))
    assert all(torch.equal(a, b) for a, b in zip(targets, written))


def test_daemon_down_is_a_miss_not_an_exception(daemon: DaemonProcess, backends: list[Any]) -> None:
    keys = page_hashes(_tokens(6), SHAPE.page)
    pool, backend = _server(daemon, backends, "page_first", timeout_s=0.5)
    slots, _ = _stored(pool, backend, keys, seed=19)
    daemon.kill()

    assert backend.batch_exists(keys) == 0
    assert backend.batch_get_v1(keys, slots) == [False] * PAGES
    assert backend.batch_set_v1(keys, slots) == [False] * PAGES
    assert not backend.exists(keys[0])
    assert backend.get(keys[0]) is None
    assert backend.batch_get(keys, None) == [None] * PAGES
    assert not backend.set(keys[0], pool.get_data_page(0))
    assert not backend.batch_set(keys[:1], [pool.get_data_page(0)])


def test_pages_come_back_from_l3_after_the_daemon_restarts(
    daemon: DaemonProcess, backends: list[Any]
) -> None:
    keys = page_hashes(_tokens(10), SHAPE.page)
    pool, backend = _server(daemon, backends, "layer_first", timeout_s=0.5)
    slots, written = _stored(pool, backend, keys, seed=37)
    daemon.stop()  # a stop writes what is only in L2 down to L3 (write-downs the watermark policy deferred)
    assert backend.batch_exists(keys) == 0
    daemon.start()  # same socket and L3: the backend reconnects and registers its namespace again
    assert backend.client.wait_ready(30)  # past the reconnect backoff of the calls that failed meanwhile
    assert backend.batch_exists(keys) == PAGES
    fill(pool, slots, seed=41)  # overwrite what was stored, then load it back
    assert backend.batch_get_v1(keys, slots) == [True] * PAGES
    assert all(torch.equal(a, b) for a, b in zip(pages_of(pool, slots), written))


def test_never_started_daemon_is_a_miss(tmp_path: Any, backends: list[Any]) -> None:
    pool = host_pool("page_first", SHAPE)
    config = storage_config({"address": f"unix:{tmp_path}/none.sock", "timeout_s": 0.5}, "page_first")
    backend = attach(pool, config)
    backends.append(backend)
    keys = page_hashes(_tokens(7), SHAPE.page)
    slots = pool.alloc(PAGES * SHAPE.page)
    assert backend.batch_exists(keys) == 0
    assert backend.batch_get_v1(keys, slots) == [False] * PAGES
    assert backend.batch_set_v1(keys, slots) == [False] * PAGES
