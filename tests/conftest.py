"""Shared fixtures: layouts, namespaces and payloads for the whole suite."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from tiercache.keys import Namespace
from tiercache.layout import KVDtype, KVLayout

pytest_plugins = ["tiercache.testing.plugin"]
"""The process harness's fixtures (daemons, Redis, engine processes) for every directory."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``@pytest.mark.gpu`` tests on hosts without CUDA."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def small_layout() -> KVLayout:
    """A tiny bf16 layout: 2 layers x 2 heads x 8 dims x 16 tokens = 2 KiB per chunk."""
    return KVLayout(
        num_layers=2, num_kv_heads=2, head_dim=8, dtype=KVDtype.BFLOAT16, chunk_tokens=16, page_tokens=16
    )


@pytest.fixture
def namespace(small_layout: KVLayout) -> Namespace:
    """A namespace over ``small_layout``."""
    return Namespace(model_id="test/llama-tiny", revision="r1", layout=small_layout, tokenizer_id="tok-v1")


@pytest.fixture
def random_kv() -> Callable[[int, int], torch.Tensor]:
    """A factory of realistic KV bytes: random bf16 values as a 1-D uint8 tensor of ``nbytes`` bytes."""

    def make(nbytes: int, seed: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        return torch.randn(nbytes // 2, generator=gen).to(torch.bfloat16).view(torch.uint8).clone()

    return make
