"""Moves KV between tiercache's chunk layout and a Hugging Face ``DynamicCache``, and runs the model on it.

The chunk layout per layer is ``[2, tokens, kv_heads, head_dim]``; a ``DynamicCache`` layer holds keys and
values as ``[batch, kv_heads, tokens, head_dim]`` (batch 1 here; GQA heads are stored once, not repeated).
A load lands straight in the cache's layout: :class:`PrefixBuffers` allocates ``[2, kv_heads, tokens, dim]``
per layer and hands the connector a permuted view in the chunk layout, so the connector's one copy per chunk
and layer is the only copy. A store stages the prompt's keys and values in one ``[2, heads, tokens, dim]``
tensor per layer (one copy: K and V live in separate tensors in the cache).

Primitives:
    PrefixBuffers: per-layer buffers a load fills, and the ``DynamicCache`` they become.
    new_cache / cache_from_prefix: an empty cache, or one holding a prefix (no copy for plain layers).
    layer_kv: the keys and values of one cache layer.
    prompt_kv: the chunk-layout view of a cache's first tokens (for a store).
    ModelRunner: one forward pass over some tokens after a cache, with the right kwargs for the
        installed transformers version.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from tiercache.errors import InvalidArgumentError
from tiercache.layout import KVLayout

from .kv import ContiguousKV


@dataclass(frozen=True, slots=True, eq=False)
class PrefixBuffers:
    """Per-layer buffers ``[2, kv_heads, tokens, head_dim]`` that a load fills in the cache's layout.

    Attributes:
        layers: one buffer per layer; ``[0]`` holds keys, ``[1]`` values.
    """

    layers: tuple[torch.Tensor, ...]

    @classmethod
    def allocate(cls, layout: KVLayout, tokens: int, device: torch.device) -> PrefixBuffers:
        """Uninitialised buffers for ``tokens`` tokens of every layer of ``layout`` on ``device``."""
        shape = (2, layout.num_kv_heads, tokens, layout.head_dim)
        dtype = layout.dtype.torch_dtype
        return cls(tuple(torch.empty(shape, dtype=dtype, device=device) for _ in range(layout.num_layers)))

    def engine_kv(self) -> ContiguousKV:
        """The connector's view of the buffers: per layer ``[2, tokens, kv_heads, head_dim]`` (no copy)."""
        return ContiguousKV([buf.permute(0, 2, 1, 3) for buf in self.layers])

    def keys_values(self, tokens: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, keys and values of the first ``tokens`` tokens as ``[1, kv_heads, tokens, dim]`` views."""
        return [(buf[0, :, :tokens].unsqueeze(0), buf[1, :, :tokens].unsqueeze(0)) for buf in self.layers]


def new_cache(model: PreTrainedModel) -> DynamicCache:
    """An empty ``DynamicCache`` shaped by the model's config.

    Raises:
        InvalidArgumentError: a layer is not a plain full-attention ``DynamicLayer`` (e.g. sliding window):
            its cache would not hold every position, so chunks could not be stored or loaded.
    """
    cache = DynamicCache(config=model.config)
    for i, layer in enumerate(getattr(cache, "layers", ())):
        if not isinstance(layer, DynamicLayer) or getattr(layer, "is_sliding", False):
            raise InvalidArgumentError(
                "model",
                f"cache layer {i} is a {type(layer).__name__}; only full-attention layers are supported",
            )
    return cache


def cache_from_prefix(
    model: PreTrainedModel, prefix: Sequence[tuple[torch.Tensor, torch.Tensor]]
) -> DynamicCache:
    """A ``DynamicCache`` holding ``prefix`` (per layer keys and values ``[1, kv_heads, tokens, head_dim]``).

    Plain ``DynamicLayer`` layers take the tensors as they are (what ``update`` on an empty layer computes,
    without its copy); other layer types go through ``update``. The cache never writes into the tensors: the
    next ``update`` concatenates into new ones.
    """
    cache = new_cache(model)
    layers = getattr(cache, "layers", None)
    for i, (keys, values) in enumerate(prefix):
        layer = layers[i] if layers is not None and i < len(layers) else None
        if type(layer) is DynamicLayer:
            layer.lazy_initialization(keys, values)
            layer.keys, layer.values = keys, values
        else:
            cache.update(keys, values, i)
    return cache


def layer_kv(cache: DynamicCache, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values ``[batch, kv_heads, tokens, head_dim]`` of one cache layer."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        entry = layers[layer]
        return entry.keys, entry.values
    legacy: Any = cache  # transformers < 4.54: per-layer lists
    return legacy.key_cache[layer], legacy.value_cache[layer]


def prompt_kv(cache: DynamicCache, layout: KVLayout, tokens: int) -> ContiguousKV:
    """The first ``tokens`` tokens of ``cache`` (batch row 0) staged in the chunk layout (one copy per layer)."""
    staged = []
    for i in range(layout.num_layers):
        keys, values = layer_kv(cache, i)
        buf = torch.empty(
            (2, layout.num_kv_heads, tokens, layout.head_dim), dtype=keys.dtype, device=keys.device
        )
        buf[0].copy_(keys[0, :, :tokens])
        buf[1].copy_(values[0, :, :tokens])
        staged.append(buf.permute(0, 2, 1, 3))
    return ContiguousKV(staged)


class ModelRunner:
    """Runs a causal LM over tokens that follow a cache, returning the last position's logits.

    The keyword names differ across transformers versions (``cache`` / ``past_key_values``,
    ``logits_to_keep`` / ``num_logits_to_keep``, ``cache_position``); they are read once from the signature.

    Attributes:
        model: the model.
        device: the device of its parameters.
    """

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._logits_kw = next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in params), None)
        self._cache_position = "cache_position" in params

    def last_logits(self, tokens: Sequence[int], start: int, cache: DynamicCache) -> torch.Tensor:
        """Run ``tokens`` at positions ``start, start + 1, ...`` after ``cache`` (which holds ``start``).

        Args:
            tokens: token ids to run (at least one).
            start: position of ``tokens[0]``; the cache must hold exactly the positions before it.
            cache: the request's cache, extended in place with the KV of ``tokens``.

        Returns:
            Float logits ``[vocab]`` of the last of ``tokens``.
        """
        n = len(tokens)
        ids = torch.tensor([list(tokens)], dtype=torch.long, device=self.device)
        positions = torch.arange(start, start + n, dtype=torch.long, device=self.device)
        kwargs: dict[str, object] = {
            self._cache_kw: cache,
            "position_ids": positions.unsqueeze(0),
            "use_cache": True,
        }
        if self._logits_kw is not None:
            kwargs[self._logits_kw] = 1
        if self._cache_position:
            kwargs["cache_position"] = positions
        with torch.inference_mode():
            out = self.model(input_ids=ids, **kwargs)
        logits: torch.Tensor = out.logits[0, -1]
        return logits
