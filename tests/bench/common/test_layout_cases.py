"""The KV layouts the connector and workload benchmarks measure (``--layouts``)."""

from __future__ import annotations

import argparse

import pytest

from tiercache.bench.common.layout_cases import PRESETS, LayoutCase, parse_layouts
from tiercache.layout import KVDtype


def test_presets_and_shapes_parse_in_order() -> None:
    assert parse_layouts("7b, 2x4x64,TINY") == (
        ("7b", *PRESETS["7b"]),
        ("2x4x64", 2, 4, 64),
        ("tiny", *PRESETS["tiny"]),
    )


@pytest.mark.parametrize("text", ["", " , ", "13b", "2x4", "2x0x64", "axbxc"])
def test_unknown_or_malformed_layouts_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_layouts(text)


def test_a_case_is_a_bf16_layout_paged_by_16_when_the_chunk_allows() -> None:
    case = LayoutCase("tiny", 4, 2, 64, chunk_tokens=256)
    layout = case.layout()
    assert case.label == "tiny/256t"
    assert (layout.num_layers, layout.num_kv_heads, layout.head_dim) == (4, 2, 64)
    assert layout.dtype is KVDtype.BFLOAT16 and layout.chunk_tokens == 256 and layout.page_tokens == 16
    assert LayoutCase("odd", 1, 1, 8, chunk_tokens=24).layout().page_tokens == 24
