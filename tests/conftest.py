"""The suite's tiers, and shared fixtures (layouts, namespaces and payloads) for every test.

Tiers: every test belongs to exactly one of unit, integration, e2e and chaos, given by where it lives
(:data:`TIERS`: a path's longest entry wins), with that tier's per-test timeout (pytest-timeout: setup, call
and teardown together). A test under no entry stops the run. ``tests/run`` runs the tiers one after another
(``pytest -m <tier>``); under ``-m <tier>`` the paths that hold no test of that tier are not even imported.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from pathlib import Path

import pytest
import torch

from tiercache.keys import Namespace
from tiercache.layout import KVDtype, KVLayout

pytest_plugins = ["tiercache.testing.plugin"]
"""The process harness's fixtures (daemons, Redis, engine processes) for every directory."""


class Tier(Enum):
    """A tier of the suite; the value is its marker."""

    UNIT = "unit"
    INTEGRATION = "integration"
    E2E = "e2e"
    CHAOS = "chaos"


TIERS: dict[str, Tier] = {
    "tests/test_house.py": Tier.UNIT,
    "tests/test_tiers.py": Tier.UNIT,
    "tests/proto": Tier.UNIT,
    "tests/tiercache": Tier.UNIT,  # in process (the shared tier's conformance cases start a Redis Cluster)
    "tests/bench": Tier.INTEGRATION,  # tiny bench runs, most against a daemon process they start
    "tests/bench/vllm_engines/test_vllm_bench.py": Tier.E2E,
    "tests/bench/serve/test_serve_bench.py": Tier.E2E,  # a real ``vllm serve``
    "tests/daemon": Tier.INTEGRATION,
    "tests/connector": Tier.INTEGRATION,
    "tests/connector/vllm": Tier.E2E,
    "tests/connector/sglang": Tier.INTEGRATION,  # SGLang's real host pools and factory, real daemons, no engine
    "tests/shared": Tier.E2E,  # daemons and caches of two hosts on a real Redis Cluster
    "tests/shared/test_faults.py": Tier.CHAOS,
    "tests/security": Tier.INTEGRATION,  # attacks on real daemon processes, other uids through setpriv
    "tests/tenants": Tier.E2E,
    "tests/testing": Tier.INTEGRATION,  # the harness itself: real daemon and engine processes
    "tests/faults": Tier.CHAOS,
}
"""Paths under the repository root -> tier; a path takes its longest entry."""

TIMEOUT_S: dict[Tier, int] = {Tier.UNIT: 300, Tier.INTEGRATION: 600, Tier.E2E: 1200, Tier.CHAOS: 1200}
"""Each tier's limit per test: a hung test fails with its stacks instead of stalling the run."""


def tier_of(path: str) -> Tier | None:
    """The tier of ``path`` (relative to the repository root, ``/``-separated); None when no entry covers it."""
    parts = path.split("/")
    for n in range(len(parts), 0, -1):
        tier = TIERS.get("/".join(parts[:n]))
        if tier is not None:
            return tier
    return None


def _relative(config: pytest.Config, path: Path) -> str:
    """``path`` relative to the repository root (as it is where the root is elsewhere: under no entry)."""
    return path.relative_to(config.rootpath).as_posix() if path.is_relative_to(config.rootpath) else str(path)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under ``-m <tier>``, leave out the paths that hold no test of that tier (untiered ones stay, to fail)."""
    try:
        wanted = Tier(config.option.markexpr)
    except ValueError:
        return None
    path = _relative(config, collection_path)
    tier = tier_of(path)
    if tier is None or tier is wanted:
        return None
    if any(t is wanted and p.startswith(path + "/") for p, t in TIERS.items()):
        return None
    return True


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by the markers added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test with its tier and that tier's timeout; skip ``@pytest.mark.gpu`` tests without CUDA.

    Raises:
        pytest.UsageError: a test under no entry of :data:`TIERS`, or one that names a tier itself.
    """
    timeouts = config.pluginmanager.hasplugin("timeout")
    untiered: list[str] = []
    for item in items:
        tier = tier_of(_relative(config, item.path))
        if tier is None or any(item.get_closest_marker(t.value) for t in Tier):
            untiered.append(item.nodeid)
            continue
        item.add_marker(tier.value)
        if timeouts:
            item.add_marker(pytest.mark.timeout(TIMEOUT_S[tier]))
    if untiered:
        raise pytest.UsageError(
            "every test takes its tier from tests/conftest.py's TIERS, by path, and only from there: "
            + ", ".join(untiered[:5])
        )
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
