"""The tiercache namespace of an SGLang server's pages, and its page keys.

SGLang's page hashes (``get_storage_hash_str``: SHA-256 chains over token ids) carry no model, no TP shard
and no salt. Each hash is mapped to a tiercache key (BLAKE2b-256 of the hash string) inside a namespace built
from what changes the page's bytes:

* from SGLang's ``HiCacheStorageConfig``: the served model name, TP rank and size (MLA: neither: every rank
  holds the same latents, and rank 0 alone writes them), PP rank and size;
* from the registered host pool (:mod:`.pages`): the chunk layout (layers, heads, head size, dtype, page
  size, MLA) and the chunk's byte order, folded into the revision as ``<revision>+kv:sglang-<order>``
  (:class:`~tiercache.keys.Namespace` has no field for it, as for vLLM's backend layout);
* from the extra config: the model's name when given, its revision, and the tenant's ``cache_salt``.

Two servers share a page only when all of these agree; the daemon further scopes every key by the tenant
its token authenticates.

Primitives:
    StorageIdentity: the per-server part (a frozen dataclass); ``namespace(pages)`` once the pool is known.
    storage_identity: read it from SGLang's storage config and the options.
    page_keys: SGLang page hashes -> tiercache keys.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tiercache.errors import InvalidArgumentError
from tiercache.keys import KEY_BYTES, Namespace

from .config import SglangStorageOptions
from .pages import HostPages


@dataclass(frozen=True, slots=True)
class StorageIdentity:
    """What makes one SGLang rank's pages what they are, besides its host pool.

    Attributes:
        model_id: the model.
        revision: its weight revision ("" for none).
        cache_salt: the tenant's cache salt ("" for none).
        mla: the model uses multi-head latent attention.
        writer: this rank stores pages (MLA: TP rank 0 only; otherwise every rank).
        tp_rank, tp_size, pp_rank, pp_size: the namespace's shard (MLA: TP 0 of 1).
    """

    model_id: str
    revision: str
    cache_salt: str
    mla: bool
    writer: bool
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1

    def namespace(self, pages: HostPages) -> Namespace:
        """The namespace of this rank's pages in a pool of ``pages``' layout."""
        return Namespace(
            model_id=self.model_id,
            revision=f"{self.revision}+kv:sglang-{pages.order.value}",
            layout=pages.layout,
            tp_rank=self.tp_rank,
            tp_size=self.tp_size,
            pp_rank=self.pp_rank,
            pp_size=self.pp_size,
            cache_salt=self.cache_salt,
        )


def _int(config: Any, name: str, default: int) -> int:
    value = getattr(config, name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"storage_config.{name}", f"must be an integer, got {value!r}")
    return value


def storage_identity(config: Any, options: SglangStorageOptions) -> StorageIdentity:
    """The identity of the rank that SGLang's ``HiCacheStorageConfig`` ``config`` describes.

    Raises:
        InvalidArgumentError: no model name (neither SGLang's nor ``model`` in the extra config), or a
            parallelism this backend does not shard (attention context parallelism, decode context
            parallelism), naming the field.
    """
    model = options.model or str(getattr(config, "model_name", None) or "")
    if not model:
        raise InvalidArgumentError("extra_config.model", "SGLang gave no model name: set one")
    for name in ("attn_cp_size", "dcp_size"):
        if _int(config, name, 1) != 1:
            raise InvalidArgumentError(f"storage_config.{name}", "context parallelism is not supported")
    mla = bool(getattr(config, "is_mla_model", False))
    tp_rank, tp_size = _int(config, "tp_rank", 0), _int(config, "tp_size", 1)
    return StorageIdentity(
        model_id=model,
        revision=options.revision,
        cache_salt=options.cache_salt,
        mla=mla,
        writer=not mla or tp_rank == 0,
        tp_rank=0 if mla else tp_rank,
        tp_size=1 if mla else tp_size,
        pp_rank=_int(config, "pp_rank", 0),
        pp_size=_int(config, "pp_size", 1),
    )


def page_keys(hashes: Sequence[str]) -> list[bytes]:
    """The tiercache keys of SGLang page hashes (any strings; equal hashes give equal keys).

    Raises:
        InvalidArgumentError: a hash is not a string.
    """
    keys: list[bytes] = []
    for i, h in enumerate(hashes):
        if not isinstance(h, str):
            raise InvalidArgumentError(f"keys[{i}]", f"must be a string, got {type(h).__name__}")
        keys.append(hashlib.blake2b(h.encode(), digest_size=KEY_BYTES, person=b"tc-sglang").digest())
    return keys
