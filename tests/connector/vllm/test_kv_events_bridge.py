"""The KV-events bridge's bookkeeping, without an engine: real vLLM ``Request`` objects (vLLM's own block
hasher) and the daemon feed's events as :class:`~tiercache.connector.watch.WatchedEvent`.

* A chunk stored before the engine saw its prompt is reported when the prompt arrives; one seen first is
  reported when it is stored; a tier reported once is not reported again.
* REMOVED, a namespace's CLEARED and a RESYNC report removals of exactly what was reported.
* L1 is not reported; the shared tier is STORAGE with remote locality.
* The bounded catalog reports what it forgets as removed.
* A cache salt and a LoRA adapter travel in ``extra_keys`` / ``lora_name`` as vLLM's block pool fills them.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'tiercache[vllm]')")

from vllm import SamplingParams
from vllm.distributed.kv_events import BlockRemoved, BlockStored
from vllm.lora.request import LoRARequest
from vllm.utils.hashing import sha256_cbor
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash, maybe_convert_block_hash
from vllm.v1.request import Request

from tests.connector.vllm.conftest import prompt
from tiercache.connector.vllm.kv_events import KVEventsBridge
from tiercache.connector.vllm.layout import BackendLayout
from tiercache.connector.vllm.namespace import EngineIdentity, request_factors
from tiercache.connector.watch import WatchedEvent, WatchedKind
from tiercache.keys import chunk_keys
from tiercache.layout import KVDtype, KVLayout
from tiercache.tiers.base import TierLevel

BLOCK = 16
CHUNK = 32  # two blocks a chunk
IDENTITY = EngineIdentity("tiny", "", BackendLayout.CPU, KVLayout(2, 2, 64, KVDtype.FLOAT32, CHUNK, BLOCK))
HANDLE = b"ns-1"

init_none_hash(sha256_cbor)
HASHER = get_request_block_hasher(BLOCK, sha256_cbor)


def _request(tokens: list[int], salt: str | None = None, lora: LoRARequest | None = None) -> Request:
    return Request(
        "r",
        tokens,
        SamplingParams(max_tokens=1),
        None,
        cache_salt=salt,
        lora_request=lora,
        block_hasher=HASHER,
    )


def _keys(request: Request) -> list[bytes]:
    ns = IDENTITY.namespace(*request_factors(request))
    full = len(request.prompt_token_ids or ()) // CHUNK * CHUNK
    return chunk_keys(ns, list(request.prompt_token_ids or ())[:full])


def _event(kind: WatchedKind, key: bytes, tier: TierLevel | None = TierLevel.L2) -> WatchedEvent:
    return WatchedEvent(kind, tier, HANDLE, key)


def _hashes(events: list[Any]) -> list[Any]:
    return [h for e in events for h in e.block_hashes]


def test_stored_before_or_after_the_prompt_is_seen_and_removed() -> None:
    bridge = KVEventsBridge(IDENTITY)
    request = _request(prompt(1, 3 * CHUNK + 5))
    k0, k1, k2 = _keys(request)
    bridge.on_event(_event(WatchedKind.STORED, k0))  # stored before this engine saw the prompt
    assert bridge.take_events() == []
    bridge.note(request)
    (first,) = bridge.take_events()
    assert isinstance(first, BlockStored) and first.medium == "CPU" and first.ownership == "tiercache"
    assert first.token_ids == request.prompt_token_ids[:CHUNK] and first.block_size == BLOCK
    assert first.parent_block_hash is None and len(first.block_hashes) == 2

    bridge.on_event(_event(WatchedKind.STORED, k1))
    bridge.on_event(_event(WatchedKind.STORED, k1))  # (again: a tier is reported once)
    bridge.on_event(_event(WatchedKind.STORED, k1, TierLevel.L3))
    bridge.on_event(_event(WatchedKind.STORED, k2, TierLevel.L1))  # not reported: vLLM's GPU medium
    bridge.on_event(_event(WatchedKind.STORED, k2, TierLevel.SHARED))
    cpu, storage, shared = bridge.take_events()
    assert (cpu.medium, storage.medium, storage.locality) == ("CPU", "STORAGE", "LOCAL")
    assert (shared.medium, shared.locality) == ("STORAGE", "REMOTE")
    assert cpu.parent_block_hash == first.block_hashes[-1]
    assert _hashes([first, cpu, shared]) == [maybe_convert_block_hash(h) for h in request.block_hashes[:6]]
    assert cpu.token_ids == request.prompt_token_ids[CHUNK : 2 * CHUNK]

    bridge.on_event(_event(WatchedKind.REMOVED, k1, TierLevel.L2))
    bridge.on_event(_event(WatchedKind.REMOVED, k1, TierLevel.L2))  # (again: nothing more)
    (removed,) = bridge.take_events()
    assert isinstance(removed, BlockRemoved) and removed.medium == "CPU"
    assert removed.block_hashes == cpu.block_hashes and removed.ownership == "tiercache"

    bridge.on_event(WatchedEvent(WatchedKind.CLEARED, None, HANDLE, b""))  # the namespace was purged
    cleared = bridge.take_events()
    assert {(e.medium, e.locality, tuple(e.block_hashes)) for e in cleared} == {
        ("CPU", "LOCAL", tuple(first.block_hashes)),
        ("STORAGE", "LOCAL", tuple(cpu.block_hashes)),
        ("STORAGE", "REMOTE", tuple(shared.block_hashes)),
    }
    assert all(isinstance(e, BlockRemoved) for e in cleared)


def test_resync_removes_what_was_reported_and_the_feed_reports_it_again() -> None:
    bridge = KVEventsBridge(IDENTITY)
    request = _request(prompt(2, 2 * CHUNK))
    bridge.note(request)
    for key in _keys(request):
        bridge.on_event(_event(WatchedKind.STORED, key))
    stored = bridge.take_events()
    bridge.on_event(WatchedEvent(WatchedKind.RESYNC, None, b"", b""))
    removed = bridge.take_events()
    assert all(isinstance(e, BlockRemoved) for e in removed) and _hashes(removed) == _hashes(stored)
    bridge.on_event(_event(WatchedKind.STORED, _keys(request)[0]))  # replayed after the RESYNC
    assert _hashes(bridge.take_events()) == _hashes(stored[:1])


def test_the_bounded_catalog_reports_what_it_forgets() -> None:
    bridge = KVEventsBridge(IDENTITY, max_chunks=2)
    old, new = _request(prompt(3, CHUNK)), _request(prompt(4, 2 * CHUNK))
    bridge.note(old)
    bridge.on_event(_event(WatchedKind.STORED, _keys(old)[0]))
    (stored,) = bridge.take_events()
    bridge.note(new)  # two more chunks: the oldest is forgotten
    (forgotten,) = bridge.take_events()
    assert isinstance(forgotten, BlockRemoved) and forgotten.block_hashes == stored.block_hashes


def test_salt_and_lora_travel_as_vllm_fills_them() -> None:
    bridge = KVEventsBridge(IDENTITY)
    lora = LoRARequest("adapter", 7, "/nonexistent")
    request = _request(prompt(5, 2 * CHUNK), salt="tenant-salt", lora=lora)
    bridge.note(request)
    k0, k1 = _keys(request)
    bridge.on_event(_event(WatchedKind.STORED, k0))
    bridge.on_event(_event(WatchedKind.STORED, k1))
    first, second = bridge.take_events()
    assert first.lora_name == "adapter" and first.lora_id == 7
    assert first.extra_keys == [
        ("adapter", "tenant-salt"),
        ("adapter",),
    ]  # the salt only at the prompt's start
    assert second.extra_keys == [("adapter",), ("adapter",)]
    assert first.block_hashes == [maybe_convert_block_hash(h) for h in request.block_hashes[:2]]


def test_the_catalog_bound_is_an_option_checked_at_start() -> None:
    from tiercache.connector.vllm.config import DEFAULT_KV_EVENTS_CHUNKS, VllmConnectorConfig
    from tiercache.errors import InvalidArgumentError

    assert VllmConnectorConfig.from_extra_config({}, 16).kv_events_chunks == DEFAULT_KV_EVENTS_CHUNKS
    assert VllmConnectorConfig.from_extra_config({"kv_events_chunks": 0}, 16).kv_events_chunks == 0
    for bad in (-1, 1.5, True, "many"):
        with pytest.raises(InvalidArgumentError, match="kv_events_chunks"):
            VllmConnectorConfig.from_extra_config({"kv_events_chunks": bad}, 16)


def test_changes_between_two_steps_are_coalesced() -> None:
    bridge = KVEventsBridge(IDENTITY)
    request = _request(prompt(6, CHUNK))
    bridge.note(request)
    (key,) = _keys(request)
    for _ in range(1000):  # an engine that does not step while another engine churns the chunk
        bridge.on_event(_event(WatchedKind.STORED, key))
        bridge.on_event(_event(WatchedKind.REMOVED, key))
    assert bridge.take_events() == []  # dropped again before vLLM asked: nothing to say
    bridge.on_event(_event(WatchedKind.STORED, key))
    bridge.on_event(_event(WatchedKind.REMOVED, key))
    bridge.on_event(_event(WatchedKind.STORED, key))
    (stored,) = bridge.take_events()
    assert isinstance(stored, BlockStored)
