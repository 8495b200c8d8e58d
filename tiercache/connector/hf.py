"""Hugging Face transformers adapter: reuse a prompt's cached prefix KV from tiercache, store what was computed.

For each request (batch size 1, greedy decoding) :class:`HFAdapter`:

1. computes the prompt's chunk keys in the model's namespace (config digest, dtype, layout, revision, tenant
   salt: see :func:`~tiercache.connector.hf_model.model_namespace`) and asks the daemon how much is cached,
   and in which tier;
2. loads that prefix through :class:`~tiercache.connector.engine.KVConnector` straight into buffers in the
   ``DynamicCache`` layout (shared memory on the same host, the byte stream otherwise);
3. runs prefill only on the uncached suffix (a fully cached prompt still recomputes its last token, whose
   logits start the generation), records the time to first token, generates greedily;
4. stores the KV of the prompt's full chunks that were not cached (the daemon skips those it holds).

On daemon trouble the adapter recomputes everything and reports 0 tokens loaded; it never raises for it.
Without a connector (``connector=None``) it is the same model loop with the cache off.

Primitives:
    HFAdapter: ``generate(tokens, max_new_tokens)``, ``prefill(tokens)``, ``load_prefix(tokens)``.
    RequestReport: per request tokens looked up / hit / loaded / reused / recomputed / stored, tiers, times.
    Generation, Prefill, PrefixLoad: what the calls return.
    build_reference_model, model_namespace: re-exported from :mod:`.hf_model`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import torch
from transformers import DynamicCache, PreTrainedModel

from tiercache.errors import InvalidArgumentError, TierCacheError
from tiercache.keys import chunk_keys
from tiercache.tiers.base import TierLevel

from .client import TierCacheClient
from .config import ConnectorConfig, DataPlaneMode
from .engine import KVConnector
from .hf_cache import ModelRunner, PrefixBuffers, cache_from_prefix, new_cache, prompt_kv
from .hf_model import build_reference_model, kv_layout, model_namespace
from .outcomes import LoadResult, StoreResult
from .results import LookupInfo

logger = logging.getLogger(__name__)

__all__ = [
    "Generation",
    "HFAdapter",
    "Prefill",
    "PrefixLoad",
    "RequestReport",
    "build_reference_model",
    "model_namespace",
    "tier_tokens",
]

_LOAD_NAMES_SOURCES = "sources" in getattr(LoadResult, "__dataclass_fields__", {})
"""Whether the connector's load results say which tier each loaded token came from."""

MIXED = "mixed"
"""Tier label of cached chunks that lie beyond every single tier's contiguous prefix."""


def tier_tokens(info: LookupInfo, chunk_tokens: int) -> Mapping[str, int]:
    """Tokens of the cached prefix per tier it will be read from (the fastest tier holding each chunk).

    A chunk counts for the fastest tier whose contiguous prefix covers it; the rest of the cached prefix
    (held by a mix of tiers) counts as ``"mixed"``.
    """
    out: dict[str, int] = {}
    covered = 0
    for tier in sorted(info.by_tier):
        reach = min(info.by_tier[tier], info.chunks)
        if reach > covered:
            out[tier.name] = (reach - covered) * chunk_tokens
            covered = reach
    if info.chunks > covered:
        out[MIXED] = (info.chunks - covered) * chunk_tokens
    return MappingProxyType(out)


@dataclass(frozen=True, slots=True)
class RequestReport:
    """What one request reused and how long it took.

    Attributes:
        prompt_tokens: tokens in the prompt.
        tokens_looked_up: tokens of the prompt's full chunks (what the cache could hold).
        tokens_hit: tokens of the cached prefix the daemon reported.
        tokens_loaded: tokens whose KV arrived intact.
        tokens_reused: loaded tokens the prefill skipped (at most ``prompt_tokens - 1``).
        tokens_recomputed: prompt tokens the model ran prefill on.
        tokens_stored: tokens of new chunks the daemon added after the request.
        tiers: tokens of the cached prefix per tier name (``L1``, ``L2``, ``L3``, ``mixed``) at lookup.
        remote: the byte stream carried the load (else shared memory, or nothing).
        cache_enabled: the request went through tiercache.
        ttft_s: request start to the first generated token's logits (includes lookup, load and prefill).
        load_s: lookup plus load, including building the cache.
        prefill_s: the suffix prefill.
        store_s: staging and storing the new chunks (after generation; not in the TTFT).
        total_s: the whole request, generation and store included.
    """

    prompt_tokens: int
    tokens_looked_up: int = 0
    tokens_hit: int = 0
    tokens_loaded: int = 0
    tokens_reused: int = 0
    tokens_recomputed: int = 0
    tokens_stored: int = 0
    tiers: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    remote: bool = False
    cache_enabled: bool = False
    ttft_s: float = 0.0
    load_s: float = 0.0
    prefill_s: float = 0.0
    store_s: float = 0.0
    total_s: float = 0.0

    @property
    def source(self) -> str:
        """The tiers the reused prefix came from, e.g. ``"L2"`` or ``"L1+L3"`` (``"-"`` when none)."""
        if self.tokens_reused == 0:
            return "-"
        return "+".join(name for name, n in self.tiers.items() if n > 0) or "-"


@dataclass(frozen=True, slots=True, eq=False)
class PrefixLoad:
    """A prompt's cached prefix loaded into a ``DynamicCache``.

    Attributes:
        cache: holds exactly ``tokens_reused`` positions (possibly 0).
        tokens_looked_up, tokens_hit, tokens_loaded, tokens_reused, tiers, remote: see :class:`RequestReport`.
        load_s: wall time of the lookup and load.
    """

    cache: DynamicCache
    tokens_looked_up: int
    tokens_hit: int
    tokens_loaded: int
    tokens_reused: int
    tiers: Mapping[str, int]
    remote: bool
    load_s: float


@dataclass(frozen=True, slots=True, eq=False)
class Prefill:
    """A prompt's prefill: the cache holding every prompt position and the logits of the last one.

    Attributes:
        cache: the request's cache (all prompt positions).
        logits: float logits ``[vocab]`` after the last prompt token.
        load: how the prefix was loaded.
        prefill_s: wall time of the suffix prefill.
    """

    cache: DynamicCache
    logits: torch.Tensor
    load: PrefixLoad
    prefill_s: float


@dataclass(frozen=True, slots=True, eq=False)
class Generation:
    """A finished request.

    Attributes:
        tokens: the generated token ids (greedy).
        first_logits: logits after the last prompt token (those that chose ``tokens[0]``).
        report: what was reused and how long it took.
    """

    tokens: tuple[int, ...]
    first_logits: torch.Tensor
    report: RequestReport


class HFAdapter:
    """Serves greedy generation from a Hugging Face causal LM with its prompt prefixes cached in tiercache.

    One request at a time, batch size 1. The model must use full-attention ``DynamicCache`` layers.

    Attributes:
        model: the model (its device and dtype are the KV's).
        connector: the tiercache connector, or None for the cache off.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        connector: KVConnector | None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """Wrap ``model``.

        Raises:
            InvalidArgumentError: the connector's layout is not the model's KV layout, or the model's cache
                is not made of full-attention layers.
        """
        self.model = model
        self.connector = connector
        self._runner = ModelRunner(model)
        self._clock = clock
        new_cache(model)  # validates the cache's layer types
        if connector is not None:
            layout = connector.namespace.layout
            if kv_layout(model, layout.chunk_tokens) != layout:
                raise InvalidArgumentError(
                    "connector.namespace.layout",
                    f"{layout} is not the model's {kv_layout(model, layout.chunk_tokens)}",
                )

    @classmethod
    def attach(
        cls,
        model: PreTrainedModel,
        client: TierCacheClient,
        chunk_tokens: int = 256,
        revision: str = "",
        cache_salt: str = "",
        model_id: str = "",
        config: ConnectorConfig | None = None,
    ) -> HFAdapter:
        """An adapter whose connector uses ``model``'s namespace (see :func:`model_namespace`)."""
        namespace = model_namespace(model, chunk_tokens, revision, cache_salt, model_id)
        return cls(model, KVConnector(client, namespace, config))

    # ------------------------------------------------------------------ load

    def load_prefix(self, tokens: Sequence[int]) -> PrefixLoad:
        """Load the cached prefix of ``tokens`` into a new ``DynamicCache`` (empty on a miss or daemon trouble).

        At most ``len(tokens) - 1`` positions are reused, so that the last prompt token is always run. When
        the connector's load results name their source tiers, the load is the only call (a load that names
        none, e.g. over the byte stream, is followed by a lookup of where the prefix is now); otherwise a
        lookup first finds the cached prefix and its tiers, and a miss skips the load.
        """
        started = self._clock()
        conn = self.connector
        if conn is None or len(tokens) == 0:
            return PrefixLoad(new_cache(self.model), 0, 0, 0, 0, MappingProxyType({}), False, 0.0)
        layout = conn.namespace.layout
        full = len(tokens) // layout.chunk_tokens * layout.chunk_tokens
        tiers: Mapping[str, int] = MappingProxyType({})
        if _LOAD_NAMES_SOURCES:
            to_load = full
        else:
            to_load, tiers = self._lookup(tokens)
        if to_load == 0:
            remote = conn.config.data_plane is DataPlaneMode.STREAM
            return PrefixLoad(new_cache(self.model), full, 0, 0, 0, tiers, remote, self._clock() - started)
        buffers = PrefixBuffers.allocate(layout, to_load, self._runner.device)
        result = conn.load(tokens[:to_load], buffers.engine_kv())
        if _LOAD_NAMES_SOURCES:
            sources: Mapping[TierLevel, int] = getattr(result, "sources", {})
            tiers = MappingProxyType({t.name: n for t, n in sorted(sources.items()) if n > 0})
            if not tiers and result.tokens_loaded:  # e.g. byte-stream loads: where the prefix is now
                tiers = self._lookup(tokens[: result.tokens_loaded])[1]
        reused = min(result.tokens_loaded, len(tokens) - 1)
        cache = cache_from_prefix(self.model, buffers.keys_values(reused) if reused else ())
        return PrefixLoad(
            cache=cache,
            tokens_looked_up=full,
            tokens_hit=result.tokens_hit,
            tokens_loaded=result.tokens_loaded,
            tokens_reused=reused,
            tiers=tiers,
            remote=result.remote,
            load_s=self._clock() - started,
        )

    def _lookup(self, tokens: Sequence[int]) -> tuple[int, Mapping[str, int]]:
        """Tokens of the cached prefix and their tiers (0 and none on daemon trouble)."""
        conn = self.connector
        assert conn is not None
        keys = chunk_keys(conn.namespace, tokens)
        if not keys:
            return 0, MappingProxyType({})
        try:
            info = conn.client.lookup(conn.namespace, keys)
        except TierCacheError as exc:
            logger.warning("tiercache lookup failed (%s); recomputing %d tokens", exc, len(tokens))
            return 0, MappingProxyType({})
        c_tokens = conn.namespace.layout.chunk_tokens
        return info.chunks * c_tokens, tier_tokens(info, c_tokens)

    # ------------------------------------------------------------------ prefill and generate

    def prefill(self, tokens: Sequence[int]) -> Prefill:
        """Load the cached prefix of ``tokens`` and run the model on the rest.

        Raises:
            InvalidArgumentError: ``tokens`` is empty.
        """
        if len(tokens) == 0:
            raise InvalidArgumentError("tokens", "the prompt is empty")
        load = self.load_prefix(tokens)
        started = self._clock()
        logits = self._runner.last_logits(tokens[load.tokens_reused :], load.tokens_reused, load.cache)
        return Prefill(load.cache, logits, load, self._clock() - started)

    def generate(self, tokens: Sequence[int], max_new_tokens: int = 32, store: bool = True) -> Generation:
        """Greedy generation of ``max_new_tokens`` tokens after the prompt ``tokens``.

        Args:
            tokens: the prompt's token ids.
            max_new_tokens: tokens to generate (at least 1).
            store: store the prompt's new full chunks afterwards (benchmarks turn it off to keep a
                fixed hit fraction).

        Returns:
            The generated tokens, the first logits and the request's report.

        Raises:
            InvalidArgumentError: an empty prompt or ``max_new_tokens < 1``.
        """
        if max_new_tokens < 1:
            raise InvalidArgumentError("max_new_tokens", f"must be >= 1, got {max_new_tokens}")
        started = self._clock()
        pre = self.prefill(tokens)
        first = int(torch.argmax(pre.logits).item())
        ttft = self._clock() - started
        out = [first]
        position = len(tokens)
        while len(out) < max_new_tokens:
            logits = self._runner.last_logits(out[-1:], position, pre.cache)
            out.append(int(torch.argmax(logits).item()))
            position += 1
        store_started = self._clock()
        stored = self._store(tokens, pre) if store else None
        done = self._clock()
        load = pre.load
        report = RequestReport(
            prompt_tokens=len(tokens),
            tokens_looked_up=load.tokens_looked_up,
            tokens_hit=load.tokens_hit,
            tokens_loaded=load.tokens_loaded,
            tokens_reused=load.tokens_reused,
            tokens_recomputed=len(tokens) - load.tokens_reused,
            tokens_stored=stored.tokens_stored if stored is not None else 0,
            tiers=load.tiers,
            remote=load.remote,
            cache_enabled=self.connector is not None,
            ttft_s=ttft,
            load_s=load.load_s,
            prefill_s=pre.prefill_s,
            store_s=done - store_started if stored is not None else 0.0,
            total_s=done - started,
        )
        logger.debug(
            "request: %d prompt tokens, %d reused, %d stored, ttft %.1f ms",
            report.prompt_tokens,
            report.tokens_reused,
            report.tokens_stored,
            report.ttft_s * 1e3,
        )
        return Generation(tuple(out), pre.logits, report)

    # ------------------------------------------------------------------ store

    def _store(self, tokens: Sequence[int], pre: Prefill) -> StoreResult | None:
        """Store the prompt's full chunks unless the daemon reported them all cached."""
        conn = self.connector
        if conn is None:
            return None
        full = pre.load.tokens_looked_up
        if full == 0 or pre.load.tokens_hit >= full:
            return StoreResult(full, 0, full if full else 0)
        return conn.store(tokens[:full], prompt_kv(pre.cache, conn.namespace.layout, full))
