"""The connector's options and its block copies, without an engine (the copies on real tensors)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'tiercache[vllm]')")

from tiercache.connector.config import DataPlaneMode
from tiercache.connector.kv import PagedKV, chunk_to_kv, kv_to_chunk
from tiercache.connector.paged import block_runs
from tiercache.connector.vllm.config import VllmConnectorConfig
from tiercache.connector.vllm.layout import BackendLayout, block_planes, check_cache
from tiercache.errors import InvalidArgumentError
from tiercache.layout import KVDtype, KVLayout
from tiercache.policies.load import LoadPolicyKind


def test_defaults_and_chunk_size() -> None:
    cfg = VllmConnectorConfig.from_extra_config({"address": "unix:/tmp/x.sock"}, block_size=32)
    assert (cfg.load_policy, cfg.chunk_tokens, cfg.token) == (LoadPolicyKind.WAIT_COMPLETE, 128, None)
    assert VllmConnectorConfig.from_extra_config(None, block_size=96).chunk_tokens == 192
    # vLLM's usual blocks of 128 tokens and more: one block per chunk, so no computed block is left out
    assert VllmConnectorConfig.from_extra_config({}, block_size=128).chunk_tokens == 128
    assert VllmConnectorConfig.from_extra_config({}, block_size=512).chunk_tokens == 512
    timeout = VllmConnectorConfig.from_extra_config({"load_policy": "timeout", "timeout_s": 0.5}, 16)
    assert (timeout.load_policy, timeout.timeout_s) == (LoadPolicyKind.TIMEOUT, 0.5)


@pytest.mark.parametrize("mode", list(DataPlaneMode))
def test_data_plane_key(mode: DataPlaneMode) -> None:
    assert VllmConnectorConfig.from_extra_config({}, block_size=32).data_plane is DataPlaneMode.AUTO
    parsed = VllmConnectorConfig.from_extra_config({"data_plane": mode.value}, block_size=32)
    assert parsed.data_plane is mode


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"adress": "unix:/x"}, "kv_connector_extra_config.adress"),
        ({"address": ""}, "address"),
        ({"token": 5}, "token"),
        ({"load_policy": "eager"}, "load_policy"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"timeout_s": "1"}, "timeout_s"),
        ({"chunk_tokens": 48}, "chunk_tokens"),
        ({"chunk_tokens": True}, "chunk_tokens"),
        ({"load_policy": "cost_aware"}, "prefill_tokens_per_s"),
        ({"load_policy": "cost_aware", "prefill_tokens_per_s": -1}, "prefill_tokens_per_s"),
        ({"data_plane": "tcp"}, "data_plane"),
        ({"data_plane": 1}, "data_plane"),
        ({"data_plane": None}, "data_plane"),
    ],
)
def test_bad_options_name_the_key(extra: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        VllmConnectorConfig.from_extra_config(extra, block_size=32)
    assert info.value.field == field


def _roundtrip(kind: BackendLayout, device: str) -> None:
    layout = KVLayout(3, 2, 64, KVDtype.FLOAT32, chunk_tokens=64, page_tokens=16)
    gen = torch.Generator().manual_seed(7)
    caches = [
        torch.randn(kind.expected_shape(20, layout), generator=gen).to(device)
        for _ in range(layout.num_layers)
    ]
    for i, c in enumerate(caches):
        check_cache(kind, layout, f"layer{i}", c)
    blocks = [11, 3, 4, 17]  # scattered, with one consecutive run
    index = torch.tensor(blocks, device=device)
    chunk = torch.zeros(layout.chunk_bytes, dtype=torch.uint8)
    kv_to_chunk(layout, PagedKV.of_blocks([block_planes(kind, c) for c in caches], blocks), 0, chunk)
    if device == "cuda":
        torch.cuda.synchronize()
    targets = [torch.zeros_like(c) for c in caches]
    into = [0, 1, 2, 5]
    # the chunk's first block is below first_block: vLLM computed it, the load must not write it
    chunk_to_kv(layout, chunk, PagedKV.of_blocks([block_planes(kind, c) for c in targets], into, 1), 0)
    blocks_dim = 0 if kind is BackendLayout.CPU else 1
    into_t = torch.tensor(into, device=device)
    for src, dst in zip(caches, targets):
        want = src.index_select(blocks_dim, index[1:])
        assert torch.equal(dst.index_select(blocks_dim, into_t[1:]), want)  # bit for bit
        assert not dst.index_select(blocks_dim, into_t[:1]).any()  # block 0 of the chunk was skipped


def test_a_last_chunk_loads_in_part() -> None:
    layout = KVLayout(2, 2, 64, KVDtype.FLOAT32, chunk_tokens=64, page_tokens=16)
    caches = [torch.randn(BackendLayout.CPU.expected_shape(8, layout)) for _ in range(2)]
    chunk = torch.zeros(layout.chunk_bytes, dtype=torch.uint8)
    kv_to_chunk(
        layout,
        PagedKV.of_blocks([block_planes(BackendLayout.CPU, c) for c in caches], [4, 5, 6, 7]),
        0,
        chunk,
    )
    targets = [torch.zeros_like(c) for c in caches]
    chunk_to_kv(
        layout, chunk, PagedKV.of_blocks([block_planes(BackendLayout.CPU, c) for c in targets], [2, 0]), 0
    )
    for src, dst in zip(caches, targets):
        assert torch.equal(dst[2], src[4]) and torch.equal(dst[0], src[5])  # the chunk's first two blocks
        assert not dst[[1, 3, 4, 5, 6, 7]].any()


@pytest.mark.parametrize("kind", list(BackendLayout))
def test_block_copies_round_trip_bit_exact(kind: BackendLayout) -> None:
    _roundtrip(kind, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", list(BackendLayout))
def test_block_copies_round_trip_bit_exact_on_cuda(kind: BackendLayout) -> None:
    _roundtrip(kind, "cuda")


def test_block_runs_group_consecutive_ids() -> None:
    assert block_runs([]) == []
    assert block_runs([7]) == [(0, 7, 1)]
    assert block_runs([3, 4, 5, 9, 10, 2, 3]) == [(0, 3, 3), (3, 9, 2), (5, 2, 2)]
    assert block_runs([5, 4]) == [(0, 5, 1), (1, 4, 1)]  # descending ids are not a run


def test_flash_chunks_are_the_canonical_layout() -> None:
    """With K and V planes apart, the chunk bytes are tiercache's ``[k|v][token][head][dim]``."""
    layout = KVLayout(1, 2, 8, KVDtype.FLOAT32, chunk_tokens=32, page_tokens=16)
    cache = torch.randn(BackendLayout.FLASH.expected_shape(4, layout))
    chunk = torch.zeros(layout.chunk_bytes, dtype=torch.uint8)
    kv_to_chunk(layout, PagedKV.of_blocks([block_planes(BackendLayout.FLASH, cache)], [2, 0]), 0, chunk)
    expected = cache.index_select(1, torch.tensor([2, 0])).reshape(2, 32, 2, 8)
    assert torch.equal(layout.layer_view(chunk, 0), expected)
    generic = torch.zeros_like(chunk)  # the connector's own paged layout is vLLM's flash layout
    kv_to_chunk(layout, PagedKV([cache], [2, 0]), 0, generic)
    assert torch.equal(generic, chunk)


def test_wrong_cache_shape_names_the_layer() -> None:
    layout = KVLayout(1, 2, 64, KVDtype.FLOAT32, chunk_tokens=32, page_tokens=32)
    with pytest.raises(InvalidArgumentError) as info:
        check_cache(BackendLayout.CPU, layout, "kv_caches['l0']", torch.zeros(4, 2, 32, 64))
    assert info.value.field == "kv_caches['l0']"
    with pytest.raises(InvalidArgumentError):
        check_cache(BackendLayout.CPU, layout, "l0", torch.zeros(4, 2, 32, 128, dtype=torch.bfloat16))
