"""``TierCacheStorage``: tiercache as SGLang HiCache's storage backend (its L3), over the shared transfer stack.

SGLang's dynamic factory imports this class and calls ``TierCacheStorage(storage_config, kwargs)``; its
cache controller then registers the host KV pool (``register_mem_pool_host``) and, with ``interface_v1``,
moves pages with the zero-copy calls:

* ``batch_exists(keys)``: one Lookup (which also starts promoting the hit into shared memory: a get
  follows); the number of leading keys the daemon holds.
* ``batch_get_v1(keys, host_indices)``: one load of the keys' chunks straight into the pool's pages (a lease
  on the daemon's shared-memory slots and one copy per page and plane, or the byte stream); the leading
  keys that arrived are True.
* ``batch_set_v1(keys, host_indices)``: one two-phase store straight from the pool's pages (pages the daemon
  holds already are skipped); all True or all False. With MLA only the storage writer (TP rank 0) writes:
  the other ranks hold the same latents and answer True.
* ``clear()`` (SGLang's ``/clear_hicache_storage_backend``): purges this server's namespace.

The legacy calls (``get``, ``batch_get``, ``set``, ``batch_set``, ``exists``) move flat page tensors in the
pool's page order through the same stack, staged in one tensor per call.

Keys: SGLang's page hashes carry no model, so each is mapped (BLAKE2b) into a namespace built from the
storage config and the pool (:mod:`.namespace`): servers of the same model, layout, TP shard and salt share
pages; any other pair never does. Daemon trouble (down, restarting, full) is logged and answered as misses
and failed writes, never raised into SGLang: its storage threads stop on an exception.

Primitives:
    TierCacheStorage: the backend class (``module_path`` ``tiercache.connector.sglang``, ``class_name``
        ``TierCacheStorage``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

from tiercache.errors import InvalidArgumentError, TierCacheError
from tiercache.keys import Namespace

from ..choice import DataPlaneChoice
from ..client import TierCacheClient
from ..config import ConnectorConfig
from ..dataplane import DataPlane
from ..kv import PagedKV
from ..kv_check import check_kv
from ..outcomes import usage_of
from ..policy import to_wire
from .config import SglangStorageOptions
from .namespace import page_keys, storage_identity
from .pages import HostPages, host_pages

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _Attached:
    """What a registered host pool gives: its pages as chunks, their namespace and its data plane."""

    pages: HostPages
    namespace: Namespace
    choice: DataPlaneChoice


class TierCacheStorage(HiCacheStorage):  # type: ignore[misc]  # SGLang's class is untyped (Any)
    """SGLang HiCache storage backend over a tiercache daemon (see the module docstring).

    Attributes:
        options: the parsed extra config.
        identity: what the namespace is built from (storage config and options).
        client: the daemon client (connects lazily: a daemon that is down is a miss, not an error here).
    """

    def __init__(self, storage_config: Any, kwargs: Any = None) -> None:
        """Build the backend as SGLang's dynamic factory does: ``Cls(storage_config, kwargs)``.

        Raises:
            InvalidArgumentError: a bad extra config, or a storage config this backend cannot serve (the
                field names the key).
        """
        self.options = SglangStorageOptions.from_extra_config(getattr(storage_config, "extra_config", None))
        self.identity = storage_identity(storage_config, self.options)
        self.client = TierCacheClient.connect(
            self.options.address, self.options.token, self.options.timeout_s
        )
        self._lock = threading.Lock()
        self._attached: _Attached | None = None

    # ------------------------------------------------------------------ registration

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Learn the host pool's layout (the namespace follows it) and view its pages as chunks.

        Raises:
            InvalidArgumentError: a pool layout this backend does not move (named).
        """
        super().register_mem_pool_host(mem_pool_host)
        pages = host_pages(mem_pool_host, self.identity.mla)
        namespace = self.identity.namespace(pages)
        choice = DataPlaneChoice(
            self.client, namespace, ConnectorConfig(data_plane=self.options.data_plane, report_usage=False)
        )
        with self._lock:
            self._attached = _Attached(pages, namespace, choice)
        logger.info(
            "tiercache storage: %s pages of %d tokens (%d bytes, %s) for %s at %s",
            pages.host_layout,
            pages.page_size,
            pages.page_bytes,
            pages.order.value,
            namespace.model_id,
            self.options.address,
        )

    @property
    def namespace(self) -> Namespace:
        """The namespace of this server's pages (known once a host pool is registered).

        Raises:
            InvalidArgumentError: no host pool registered yet.
        """
        return self._registered().namespace

    def data_plane(self) -> DataPlane:
        """The data plane this backend moves pages with (shared memory or the byte stream).

        Raises:
            InvalidArgumentError: no host pool registered yet.
            TierCacheError: the daemon could not be asked (down, refused the namespace).
        """
        return self._registered().choice.current()

    def clear(self) -> bool:
        """Remove this server's pages (its namespace) from every tier of the daemon: SGLang's
        ``/clear_hicache_storage_backend``. Other namespaces (models, salts, layouts) keep theirs; False on
        daemon trouble."""
        return self._guard("clear", False, self._purge)

    def close(self) -> None:
        """Close the daemon client (SGLang calls it when it detaches the backend)."""
        self.client.close()

    # ------------------------------------------------------------------ zero-copy (interface_v1)

    def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
        """How many leading ``keys`` the daemon holds (0 on daemon trouble)."""
        if not keys:
            return 0
        return self._guard("batch_exists", 0, lambda: self._exists(keys))

    def batch_get_v1(self, keys: list[str], host_indices: torch.Tensor, extra_info: Any = None) -> list[bool]:
        """Load the pages of ``keys`` into the pool's slots ``host_indices``; the leading ones that arrived
        are True (all False on daemon trouble)."""
        if not keys:
            return []
        loaded = self._guard("batch_get_v1", 0, lambda: self._load(keys, host_indices))
        return [i < loaded for i in range(len(keys))]

    def batch_set_v1(self, keys: list[str], host_indices: torch.Tensor, extra_info: Any = None) -> list[bool]:
        """Store the pool's pages at ``host_indices`` under ``keys``: all True, or all False (nothing
        stored: daemon trouble)."""
        if not keys:
            return []
        if not self.identity.writer:
            return [True] * len(keys)
        ok = self._guard("batch_set_v1", False, lambda: self._store(keys, host_indices))
        return [ok] * len(keys)

    # ------------------------------------------------------------------ legacy (flat page tensors)

    def exists(self, key: str) -> bool:
        """Whether the daemon holds ``key``'s page."""
        return self.batch_exists([key]) == 1

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> torch.Tensor | None:
        """``key``'s page as a flat tensor (into ``target_location`` when given), or None."""
        return self.batch_get([key], None if target_location is None else [target_location])[0]

    def batch_get(
        self, keys: list[str], target_locations: Any = None, target_sizes: Any = None
    ) -> list[torch.Tensor | None]:
        """The pages of ``keys`` as flat tensors (into ``target_locations`` when given); the leading pages
        that arrived, None from the first that did not."""
        if not keys:
            return []
        return self._guard("batch_get", [None] * len(keys), lambda: self._get_flat(keys, target_locations))

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        """Store one flat page tensor under ``key``."""
        return self.batch_set([key], [value])

    def batch_set(
        self, keys: list[str], values: Any = None, target_locations: Any = None, target_sizes: Any = None
    ) -> bool:
        """Store flat page tensors under ``keys``: True when all of them are stored."""
        if not keys:
            return True
        if not self.identity.writer:
            return True
        return self._guard("batch_set", False, lambda: self._set_flat(keys, values))

    # ------------------------------------------------------------------ internals

    def _registered(self) -> _Attached:
        with self._lock:
            attached = self._attached
        if attached is None:
            raise InvalidArgumentError("mem_pool_host", "no host pool registered (register_mem_pool_host)")
        return attached

    def _guard(self, call: str, failed: T, body: Callable[[], T]) -> T:
        """``body()``, or ``failed`` when it raises: SGLang's storage threads end on an exception, so nothing
        reaches them (daemon trouble is a warning, anything else is logged with its stack)."""
        try:
            return body()
        except TierCacheError as exc:
            logger.warning("tiercache %s failed (%s); answering as a miss", call, exc)
        except Exception:
            logger.exception("tiercache %s failed; answering as a miss", call)
        return failed

    def _exists(self, keys: Sequence[str]) -> int:
        info = self.client.lookup(self._registered().namespace, page_keys(keys), prefetch=True)
        return min(info.chunks, len(keys))

    def _purge(self) -> bool:
        removed = self.client.purge(self._registered().namespace)
        logger.info("tiercache storage cleared: %d pages removed", removed)
        return True

    def _load(self, keys: Sequence[str], host_indices: torch.Tensor) -> int:
        pages = self._registered().pages
        return self._load_into(keys, pages.pool_kv(pages.page_ids(host_indices, len(keys))))

    def _store(self, keys: Sequence[str], host_indices: torch.Tensor) -> bool:
        pages = self._registered().pages
        self._store_from(keys, pages.pool_kv(pages.page_ids(host_indices, len(keys))))
        return True

    def _load_into(self, keys: Sequence[str], kv: PagedKV) -> int:
        """Load ``keys`` into ``kv`` (chunk ``i`` for key ``i``); the leading pages that arrived."""
        attached = self._registered()
        layout = attached.pages.layout
        check_kv(layout, kv, len(keys))
        plane = attached.choice.current()
        tokens = len(keys) * layout.chunk_tokens
        result = plane.load(page_keys(keys), kv, to_wire(None, tokens), tokens)
        chunks, recomputed = usage_of(result, layout.chunk_tokens)
        if chunks or recomputed:
            self.client.defer_usage(plane.namespace, chunks, recomputed, loaded_tokens=result.sources)
        return min(result.tokens_loaded // layout.chunk_tokens, len(keys))

    def _store_from(self, keys: Sequence[str], kv: PagedKV) -> None:
        """Store ``keys`` from ``kv`` (all or none: a failure raises)."""
        attached = self._registered()
        check_kv(attached.pages.layout, kv, len(keys))
        attached.choice.current().store(page_keys(keys), kv)

    def _get_flat(self, keys: Sequence[str], targets: Any) -> list[torch.Tensor | None]:
        pages = self._registered().pages
        staging = torch.empty((len(keys), pages.page_bytes), dtype=torch.uint8)
        loaded = self._load_into(keys, pages.flat_planes(staging))
        dtype = pages.layout.dtype.torch_dtype
        out: list[torch.Tensor | None] = [None] * len(keys)
        for i in range(loaded):
            page = staging[i].view(dtype)
            target = targets[i] if targets is not None and i < len(targets) else None
            if isinstance(target, torch.Tensor):
                if target.nbytes != pages.page_bytes or not target.is_contiguous():
                    raise InvalidArgumentError(
                        f"target_locations[{i}]", f"must be a contiguous page of {pages.page_bytes} bytes"
                    )
                target.view(-1).view(torch.uint8).copy_(staging[i])
                out[i] = target
            else:
                out[i] = page
        return out

    def _set_flat(self, keys: Sequence[str], values: Any) -> bool:
        pages = self._registered().pages
        if values is None or len(values) != len(keys):
            raise InvalidArgumentError("values", f"must hold one flat page per key ({len(keys)})")
        staging = torch.empty((len(keys), pages.page_bytes), dtype=torch.uint8)
        for i, value in enumerate(values):
            flat = value.detach().reshape(-1).view(torch.uint8)
            if flat.numel() != pages.page_bytes:
                raise InvalidArgumentError(
                    f"values[{i}]", f"holds {flat.numel()} bytes, a page {pages.page_bytes}"
                )
            staging[i].copy_(flat)
        self._store_from(keys, pages.flat_planes(staging))
        return True
