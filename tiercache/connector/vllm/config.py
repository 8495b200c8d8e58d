"""The connector's options, parsed from vLLM's ``kv_connector_extra_config`` (a JSON object).

Keys (all optional):
    address: the daemon (``unix:/path``, ``/path``, ``host:port``); default: the daemon's default socket.
    token: bearer token when the daemon has a tokens file.
    load_policy: ``wait_complete`` | ``best_effort`` | ``timeout`` | ``cost_aware`` (default wait_complete).
    timeout_s: deadline of each daemon call, and the load deadline of the ``timeout`` policy (default 2).
    chunk_tokens: tokens per chunk, a positive multiple of vLLM's block size (default: the smallest multiple
        of the block size that is at least :data:`DEFAULT_MIN_CHUNK_TOKENS`, i.e. one block for vLLM's
        usual blocks of 128 tokens and more, 128 tokens for smaller blocks; why: below).
    prefill_tokens_per_s: the engine's prefill rate, declared to the daemon; required by ``cost_aware``
        (which loads only the prefix whose load beats recomputing it).
    data_plane: how the bytes move: ``auto`` (default: the daemon's shared memory when it can be mapped in
        the worker, else the byte stream), ``shm`` (shared memory only: an engine that cannot map it
        recomputes) or ``stream`` (the daemon's gRPC byte stream, e.g. for a daemon on another host).
    kv_events_chunks: when vLLM publishes KV events (``--kv-events-config``), how many chunks the connector's
        catalog of prompts remembers to report tiercache's tiers in them (:mod:`.kv_events`; default
        :data:`DEFAULT_KV_EVENTS_CHUNKS`); 0: tiercache's tiers are not reported.
    published_index: answer vLLM's scheduler from the index of L2 chunks the daemon publishes in its
        shared memory (:mod:`tiercache.tiers.published`), with no round trip, when it holds the next chunk
        of a prompt (default true; not under ``cost_aware``, whose choice needs the daemon's estimates);
        false: every lookup asks the daemon.

Why one block from 128 tokens up: only full chunks are stored, so a chunk larger than a block leaves a
prompt's last full blocks out of the cache — with 256-token chunks over 128-token blocks, a chat turn's tail
block was lost about half the time (issue 26: 9 of 24 follow-up turns got their whole previous turn back).
Smaller chunks cost per-chunk work (keys, slots, copies). With 32-token blocks, one-block chunks were 2-3x
slower to load than 128 to 512, which were within the noise of each other (TTFT ms of a fresh engine loading
from L2, ``tiercache-bench vllm`` model, median of 2 prompts, 2-core machine loaded by other jobs)::

    chunk tokens     1K 50 %   1K 100 %   2K 50 %   2K 100 %
    32 (1 block)       1004       312       2274       230
    128                 533       116       1084       175
    256                 578       164        792        98
    512                 671       193        790       142

With 128-token blocks, 128-token chunks showed no cost against 256 (100 % cached, median of 3 prompts, two
interleaved runs each on the same loaded machine, where figures varied up to 10x between runs: 393 and 474
ms vs 547 and 732 at 1K, 502 and 50 vs 59 and 334 at 2K). The commands: ``tiercache-bench vllm --lengths
1024,2048 --fractions 50,100 --repeats 2 --no-peers --no-throughput --chunk-tokens N``
(bench/results/vllm-chunk-sweep.txt) and ``... --fractions 100 --repeats 3 --block-size 128``.

An unknown key or a bad value raises :class:`~tiercache.errors.InvalidArgumentError` naming the key, so vLLM
fails at engine start instead of serving without a cache.

Primitives:
    DEFAULT_MIN_CHUNK_TOKENS: the default chunk is the first multiple of the block size at or above this.
    VllmConnectorConfig: the parsed options; ``from_extra_config`` parses and checks them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tiercache.errors import InvalidArgumentError
from tiercache.policies.load import LoadPolicyKind, PrefillModel
from tiercache.policies.registry import parse_kind

from ..config import DataPlaneMode
from ..local_daemon import default_socket

DEFAULT_MIN_CHUNK_TOKENS = 128
"""Default chunk size: the first multiple of vLLM's block size at or above this many tokens (one block from
128-token blocks up: nothing the engine computed is lost to chunk granularity)."""
DEFAULT_KV_EVENTS_CHUNKS = 65536
"""Default bound of the KV events catalog (chunks): a few tens of MiB at 256-token chunks."""
DEFAULT_TIMEOUT_S = 2.0
"""Default deadline of a daemon call (a slow daemon never stalls the engine longer than this)."""
_KEYS = (
    "address",
    "token",
    "load_policy",
    "timeout_s",
    "chunk_tokens",
    "prefill_tokens_per_s",
    "data_plane",
    "kv_events_chunks",
    "published_index",
)


def _default_chunk_tokens(block_size: int) -> int:
    return -(-DEFAULT_MIN_CHUNK_TOKENS // block_size) * block_size


@dataclass(frozen=True, slots=True)
class VllmConnectorConfig:
    """Options of one :class:`~tiercache.connector.vllm.TierCacheConnector`.

    Attributes:
        address: the daemon's address.
        token: bearer token, or None.
        load_policy: how much of a cached prefix to load and how long to wait.
        timeout_s: deadline of each daemon call (and of a ``timeout`` load).
        chunk_tokens: tokens per chunk (a multiple of the block size).
        prefill: the engine's prefill model (declared for cost-aware loads), or None.
        data_plane: shared memory, byte stream, or the first of them that works here.
        kv_events_chunks: the KV events catalog's bound (0: tiercache's tiers are not in vLLM's events).
        published_index: answer from the daemon's published L2 index when it holds the next chunk.
    """

    address: str
    token: str | None
    load_policy: LoadPolicyKind
    timeout_s: float
    chunk_tokens: int
    prefill: PrefillModel | None = None
    data_plane: DataPlaneMode = DataPlaneMode.AUTO
    kv_events_chunks: int = DEFAULT_KV_EVENTS_CHUNKS
    published_index: bool = True

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, object] | None, block_size: int) -> VllmConnectorConfig:
        """Parse ``kv_connector_extra_config`` for an engine with ``block_size``-token blocks.

        Raises:
            InvalidArgumentError: an unknown key, or a bad value (the field names the key).
        """
        extra = dict(extra or {})
        unknown = sorted(set(extra) - set(_KEYS))
        if unknown:
            raise InvalidArgumentError(
                f"kv_connector_extra_config.{unknown[0]}", f"unknown key; valid: {', '.join(_KEYS)}"
            )
        address = extra.get("address", default_socket())
        if not isinstance(address, str) or not address:
            raise InvalidArgumentError("address", f"must be a non-empty string, got {address!r}")
        token = extra.get("token")
        if token is not None and (not isinstance(token, str) or not token):
            raise InvalidArgumentError("token", f"must be a non-empty string, got {token!r}")
        policy = parse_kind(LoadPolicyKind, extra.get("load_policy", "wait_complete"), "load_policy")
        timeout = extra.get("timeout_s", DEFAULT_TIMEOUT_S)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise InvalidArgumentError("timeout_s", f"must be a number > 0, got {timeout!r}")
        chunk = extra.get("chunk_tokens", _default_chunk_tokens(block_size))
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk <= 0 or chunk % block_size:
            raise InvalidArgumentError(
                "chunk_tokens", f"must be a positive multiple of the block size {block_size}, got {chunk!r}"
            )
        rate = extra.get("prefill_tokens_per_s")
        prefill = None
        if rate is not None:
            if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
                raise InvalidArgumentError("prefill_tokens_per_s", f"must be a number > 0, got {rate!r}")
            prefill = PrefillModel(float(rate))
        elif policy is LoadPolicyKind.COST_AWARE:
            raise InvalidArgumentError("prefill_tokens_per_s", "cost_aware needs the engine's prefill rate")
        plane = parse_kind(DataPlaneMode, extra.get("data_plane", DataPlaneMode.AUTO.value), "data_plane")
        events = extra.get("kv_events_chunks", DEFAULT_KV_EVENTS_CHUNKS)
        if isinstance(events, bool) or not isinstance(events, int) or events < 0:
            raise InvalidArgumentError("kv_events_chunks", f"must be an integer >= 0, got {events!r}")
        published = extra.get("published_index", True)
        if not isinstance(published, bool):
            raise InvalidArgumentError("published_index", f"must be true or false, got {published!r}")
        published = published and policy is not LoadPolicyKind.COST_AWARE
        return cls(address, token, policy, float(timeout), chunk, prefill, plane, events, published)
