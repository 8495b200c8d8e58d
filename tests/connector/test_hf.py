"""The Hugging Face adapter against a real ``tiercache.daemon`` process and a real (seeded, random) Llama model.

Bit-exactness is checked against the KV the model itself computes for the prompt; logits and greedy tokens
against a full recompute with the cache off.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from transformers import PreTrainedModel

from tiercache.connector import ClientConfig, ConnectorConfig, DataPlaneMode, TierCacheClient, TierLevel
from tiercache.connector.hf import HFAdapter, build_reference_model, model_namespace
from tiercache.connector.hf_cache import ModelRunner, layer_kv, new_cache
from tiercache.keys import chunk_keys
from tiercache.testing.waits import wait_until

Daemon = Any  # tests/connector/conftest.py:Daemon

CHUNK = 16
PROMPT = 100  # six full chunks (96 tokens) and a partial one
FULL = 96
NEW_TOKENS = 32
WAIT_S = 30.0
TINY = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4}
"""4 layers, 8 query heads, 2 KV heads of 32 dims: fp32 chunks of 16 tokens are 32 KiB."""


def prompt(seed: int, n: int = PROMPT) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return [int(t) for t in torch.randint(0, 4096, (n,), generator=gen)]


@pytest.fixture(scope="module")
def model() -> PreTrainedModel:
    return build_reference_model(seed=0, **TINY)


@pytest.fixture(scope="module")
def model_bf16() -> PreTrainedModel:
    return build_reference_model(seed=0, dtype=torch.bfloat16, **TINY)


@pytest.fixture
def clients() -> Iterator[Callable[[str], TierCacheClient]]:
    made: list[TierCacheClient] = []

    def connect(address: str) -> TierCacheClient:
        client = TierCacheClient.connect(address, config=ClientConfig(timeout_s=10.0))
        made.append(client)
        return client

    yield connect
    for client in made:
        client.close()


def reference_kv(model: PreTrainedModel, tokens: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The model's own KV of ``tokens`` (one full forward), per layer ``[1, heads, tokens, dim]``."""
    cache = new_cache(model)
    ModelRunner(model).last_logits(tokens, 0, cache)
    return [layer_kv(cache, i) for i in range(model.config.num_hidden_layers)]


def assert_bit_identical(got: list[tuple[torch.Tensor, torch.Tensor]], want: Any, upto: int) -> None:
    for (gk, gv), (wk, wv) in zip(got, want):
        for g, w in ((gk, wk), (gv, wv)):
            assert g.shape[2] >= upto
            assert torch.equal(
                g[:, :, :upto].contiguous().view(torch.int16), w[:, :, :upto].contiguous().view(torch.int16)
            )


def _written_down(client: TierCacheClient) -> bool:
    return client.stats().pending_writes == 0


def _tier_chunks(client: TierCacheClient, tier: TierLevel) -> int:
    return sum(t.chunks for t in client.stats().tiers if t.level is tier)  # 0: the daemon has no such tier


# ---------------------------------------------------------------------------------------------- tiers


@pytest.mark.parametrize("where", ["L1-cpu-daemon", "L2", "L3-evicted", "L3-restart"])
def test_loaded_kv_is_bit_identical_from_each_tier(
    daemon_factory: Callable[..., Daemon],
    clients: Callable[[str], TierCacheClient],
    model: PreTrainedModel,
    where: str,
) -> None:
    # 6 L2 slots of 64 KiB hold one prompt's 6 chunks: a second prompt evicts the first one's (kept in L3).
    args = ["--l2-bytes", "384K", "--l1-device", "cpu" if where.startswith("L1") else "none"]
    d = daemon_factory(*args)
    d.start()
    tokens = prompt(1)
    storer = HFAdapter.attach(model, clients(d.address), chunk_tokens=CHUNK, revision="r1")
    assert storer.generate(tokens, 1).report.tokens_stored == FULL
    expect_tier = TierLevel.L2
    if where.startswith("L1"):
        # A load makes the chunks hot: the daemon copies them into L1 too; then a second prompt evicts them
        # from L2 (6 slots) and the next load must come from L1 (through a copy into a shared-memory slot).
        warm = HFAdapter.attach(model, clients(d.address), chunk_tokens=CHUNK, revision="r1")
        assert warm.load_prefix(tokens).tokens_loaded == FULL
        client = warm.connector.client  # type: ignore[union-attr]
        wait_until(lambda: _tier_chunks(client, TierLevel.L1) >= FULL // CHUNK, WAIT_S, "promotion into L1")
        assert storer.generate(prompt(2), 1).report.tokens_stored == FULL
        expect_tier = TierLevel.L1
    elif where == "L3-evicted":
        wait_until(lambda: _written_down(storer.connector.client), WAIT_S, "write-down to L3")  # type: ignore[union-attr]
        assert storer.generate(prompt(2), 1).report.tokens_stored == FULL
        expect_tier = TierLevel.L3
    elif where == "L3-restart":
        d.stop()
        d.start()
        expect_tier = TierLevel.L3
    loader = HFAdapter.attach(model, clients(d.address), chunk_tokens=CHUNK, revision="r1")
    ns = loader.connector.namespace  # type: ignore[union-attr]
    info = loader.connector.client.lookup(ns, chunk_keys(ns, tokens))  # type: ignore[union-attr]
    assert info.chunks == FULL // CHUNK
    fastest = min(t for t, n in info.by_tier.items() if n == info.chunks)
    assert fastest == expect_tier, info  # the chunks really sit in the tier under test
    load = loader.load_prefix(tokens)
    assert (load.tokens_hit, load.tokens_loaded, load.tokens_reused) == (FULL, FULL, FULL)
    assert dict(load.tiers) == {expect_tier.name: FULL}
    got = [layer_kv(load.cache, i) for i in range(model.config.num_hidden_layers)]
    assert_bit_identical(got, reference_kv(model, tokens), FULL)


# ---------------------------------------------------------------------------------------------- logits


@pytest.mark.parametrize("remote", [False, True], ids=["shm", "stream"])
def test_float32_reuse_matches_a_full_recompute(
    shared_daemon: Daemon, clients: Callable[[str], TierCacheClient], model: PreTrainedModel, remote: bool
) -> None:
    tokens = prompt(10 + remote)
    config = ConnectorConfig(DataPlaneMode.STREAM if remote else DataPlaneMode.AUTO)
    adapter = HFAdapter.attach(model, clients(shared_daemon.address), CHUNK, "r1", config=config)
    baseline = HFAdapter(model, None).generate(tokens, NEW_TOKENS)
    first = adapter.generate(tokens, NEW_TOKENS)
    assert (first.report.tokens_reused, first.report.tokens_stored) == (0, FULL)
    again = adapter.generate(tokens, NEW_TOKENS)
    rep = again.report
    assert (rep.tokens_looked_up, rep.tokens_loaded, rep.tokens_reused) == (FULL, FULL, FULL)
    assert (rep.tokens_recomputed, rep.remote, rep.source) == (PROMPT - FULL, remote, "L2")
    assert rep.ttft_s > 0 and rep.load_s > 0 and rep.tokens_stored == 0
    assert (again.first_logits - baseline.first_logits).abs().max().item() <= 1e-5
    assert again.tokens == first.tokens == baseline.tokens
    # The adapter's own decoding loop agrees with transformers' greedy generate().
    ids = torch.tensor([tokens])
    out = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    assert tuple(out[0, PROMPT:].tolist()) == baseline.tokens


def test_a_fully_cached_prompt_still_runs_its_last_token(
    shared_daemon: Daemon, clients: Callable[[str], TierCacheClient], model: PreTrainedModel
) -> None:
    tokens = prompt(12, FULL)
    adapter = HFAdapter.attach(model, clients(shared_daemon.address), CHUNK, "r1")
    adapter.generate(tokens, 1)
    again = adapter.generate(tokens, 8)
    assert (again.report.tokens_loaded, again.report.tokens_reused, again.report.tokens_recomputed) == (
        FULL,
        FULL - 1,
        1,
    )
    baseline = HFAdapter(model, None).generate(tokens, 8)
    assert (again.first_logits - baseline.first_logits).abs().max().item() <= 1e-5
    assert again.tokens == baseline.tokens


def test_bfloat16_reuse_is_within_the_models_own_noise(
    shared_daemon: Daemon, clients: Callable[[str], TierCacheClient], model_bf16: PreTrainedModel
) -> None:
    tokens = prompt(13)
    adapter = HFAdapter.attach(model_bf16, clients(shared_daemon.address), CHUNK, "r1")
    assert adapter.connector is not None and adapter.connector.namespace.layout.dtype.value == "bfloat16"
    baseline = HFAdapter(model_bf16, None).generate(tokens, NEW_TOKENS)
    adapter.generate(tokens, 1)
    again = adapter.generate(tokens, NEW_TOKENS)
    assert again.report.tokens_reused == FULL
    # The model's own noise: the same prompt recomputed with another prefill split.
    runner = ModelRunner(model_bf16)
    split = new_cache(model_bf16)
    runner.last_logits(tokens[:FULL], 0, split)
    split_logits = runner.last_logits(tokens[FULL:], FULL, split)
    noise = (split_logits - baseline.first_logits).abs().max().item()
    diff = (again.first_logits - baseline.first_logits).abs().max().item()
    assert diff <= noise + 1e-6, (diff, noise)
    assert again.tokens == baseline.tokens


# ---------------------------------------------------------------------------------------------- isolation


def test_other_revision_dtype_salt_or_config_never_hits(
    shared_daemon: Daemon,
    clients: Callable[[str], TierCacheClient],
    model: PreTrainedModel,
    model_bf16: PreTrainedModel,
) -> None:
    tokens = prompt(20)
    client = clients(shared_daemon.address)
    owner = HFAdapter.attach(model, client, CHUNK, revision="r1", cache_salt="tenant-a")
    assert owner.generate(tokens, 1).report.tokens_stored == FULL
    assert owner.generate(tokens, 1).report.tokens_reused == FULL
    others = {
        "revision": HFAdapter.attach(model, client, CHUNK, revision="r2", cache_salt="tenant-a"),
        "dtype": HFAdapter.attach(model_bf16, client, CHUNK, revision="r1", cache_salt="tenant-a"),
        "salt": HFAdapter.attach(model, client, CHUNK, revision="r1", cache_salt="tenant-b"),
        "config": HFAdapter.attach(
            build_reference_model(0, **{**TINY, "rms_norm_eps": 1e-5}), client, CHUNK, "r1", "tenant-a"
        ),
    }
    for name, other in others.items():
        rep = other.generate(tokens, 1, store=False).report
        assert (rep.tokens_hit, rep.tokens_loaded, rep.tokens_reused) == (0, 0, 0), name
    namespaces = {owner.connector.namespace} | {o.connector.namespace for o in others.values()}  # type: ignore[union-attr]
    assert len(namespaces) == 5


def test_namespace_digest_is_stable_and_ignores_volatile_fields(model: PreTrainedModel) -> None:
    twin = build_reference_model(seed=0, **TINY)
    twin.config._name_or_path = "/somewhere/else"
    twin.config.output_hidden_states = True
    assert model_namespace(twin, CHUNK, "r1") == model_namespace(model, CHUNK, "r1")
    assert model_namespace(twin, CHUNK, "r1").digest == model_namespace(model, CHUNK, "r1").digest
    assert model_namespace(model, 2 * CHUNK, "r1") != model_namespace(model, CHUNK, "r1")


# ---------------------------------------------------------------------------------------------- failures


def test_a_killed_daemon_means_full_recompute_and_zero_loaded(
    daemon: Daemon, clients: Callable[[str], TierCacheClient], model: PreTrainedModel
) -> None:
    tokens = prompt(30)
    adapter = HFAdapter.attach(model, clients(daemon.address), CHUNK, "r1")
    baseline = HFAdapter(model, None).generate(tokens, 8)
    adapter.generate(tokens, 1)
    assert adapter.generate(tokens, 1).report.tokens_reused == FULL
    daemon.stop(signal.SIGKILL)
    for _ in range(2):  # the first call fails at the socket, the second at the client's backoff
        out = adapter.generate(tokens, 8)
        rep = out.report
        assert (rep.tokens_hit, rep.tokens_loaded, rep.tokens_reused, rep.tokens_stored) == (0, 0, 0, 0)
        assert rep.tokens_recomputed == PROMPT and rep.source == "-"
        assert out.tokens == baseline.tokens


def test_cache_off_and_short_prompts(model: PreTrainedModel) -> None:
    off = HFAdapter(model, None)
    rep = off.generate(prompt(40, 5), 3).report
    assert (rep.prompt_tokens, rep.tokens_looked_up, rep.tokens_recomputed, rep.cache_enabled) == (
        5,
        0,
        5,
        False,
    )
    with pytest.raises(Exception, match="empty"):
        off.generate([], 1)
    with pytest.raises(Exception, match="max_new_tokens"):
        off.generate([1, 2], 0)
