"""KVLayout: sizes, layer-major byte layout, views and validation."""

from __future__ import annotations

import pytest
import torch

from tiercache.errors import InvalidArgumentError
from tiercache.layout import KVDtype, KVLayout


def test_sizes_of_a_7b_like_layout() -> None:
    lay = KVLayout(num_layers=32, num_kv_heads=8, head_dim=128, dtype=KVDtype.BFLOAT16, chunk_tokens=256)
    assert lay.layer_bytes == 2 * 256 * 8 * 128 * 2
    assert lay.chunk_bytes == 32 * lay.layer_bytes == 32 * 2**20


def test_layer_major_layout_matches_a_stacked_tensor() -> None:
    lay = KVLayout(
        num_layers=3, num_kv_heads=2, head_dim=4, dtype=KVDtype.FLOAT32, chunk_tokens=8, page_tokens=4
    )
    kv = torch.randn(3, 2, 8, 2, 4)  # [layer][k|v][token][head][dim]
    buf = kv.contiguous().view(torch.uint8).flatten()
    assert buf.numel() == lay.chunk_bytes
    for layer in range(3):
        assert torch.equal(lay.layer_view(buf, layer), kv[layer])
        start, stop = lay.layer_range(layer)
        assert torch.equal(buf[start:stop], kv[layer].contiguous().view(torch.uint8).flatten())
    assert torch.equal(lay.chunk_view(buf), kv)


def test_layer_view_shares_memory() -> None:
    lay = KVLayout(
        num_layers=2, num_kv_heads=1, head_dim=4, dtype=KVDtype.BFLOAT16, chunk_tokens=4, page_tokens=4
    )
    buf = torch.zeros(lay.chunk_bytes, dtype=torch.uint8)
    lay.layer_view(buf, 1).fill_(1.0)
    assert torch.all(buf[: lay.layer_bytes] == 0)
    assert torch.any(buf[lay.layer_bytes :] != 0)


def test_mla_layout() -> None:
    lay = KVLayout(
        num_layers=4, num_kv_heads=1, head_dim=576, dtype=KVDtype.BFLOAT16, chunk_tokens=64, mla=True
    )
    assert lay.kv_planes == 1 and lay.layer_shape == (64, 576)
    assert lay.chunk_bytes == 4 * 64 * 576 * 2
    buf = torch.zeros(lay.chunk_bytes, dtype=torch.uint8)
    assert lay.layer_view(buf, 3).shape == (64, 576)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"num_layers": 0}, "num_layers"),
        ({"num_kv_heads": -1}, "num_kv_heads"),
        ({"head_dim": 0}, "head_dim"),
        ({"chunk_tokens": 24, "page_tokens": 16}, "chunk_tokens"),
        ({"chunk_tokens": 0}, "chunk_tokens"),
        ({"page_tokens": 0}, "page_tokens"),
        ({"mla": True}, "num_kv_heads"),
        ({"dtype": "bf16"}, "dtype"),
    ],
)
def test_bad_layouts_name_the_field(kwargs: dict[str, object], field: str) -> None:
    base: dict[str, object] = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 8, "dtype": KVDtype.BFLOAT16}
    with pytest.raises(InvalidArgumentError, match=f"^{field}:"):
        KVLayout(**{**base, **kwargs})  # type: ignore[arg-type]


def test_bad_buffers_and_layers(small_layout: KVLayout) -> None:
    with pytest.raises(InvalidArgumentError, match="payload: has 10 bytes"):
        small_layout.layer_view(torch.zeros(10, dtype=torch.uint8), 0)
    with pytest.raises(InvalidArgumentError, match="payload: must be a 1-D uint8"):
        small_layout.check_buffer(torch.zeros(small_layout.chunk_bytes, dtype=torch.int16))
    buf = torch.zeros(small_layout.chunk_bytes, dtype=torch.uint8)
    with pytest.raises(InvalidArgumentError, match="layer"):
        small_layout.layer_view(buf, small_layout.num_layers)


def test_dtype_mapping() -> None:
    assert KVDtype.from_torch(torch.bfloat16) is KVDtype.BFLOAT16
    assert KVDtype.FP8_E4M3.itemsize == 1 and KVDtype.FLOAT32.itemsize == 4
    with pytest.raises(InvalidArgumentError, match="dtype"):
        KVDtype.from_torch(torch.complex64)
