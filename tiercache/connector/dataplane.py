"""The data-plane interface: how a connector's bytes move between the daemon and the engine's tensors.

Two implementations (the transfer handlers of :mod:`.handlers`, registered by the media they move bytes
between), chosen once per connector (and again only when the daemon is re-registered):

* :class:`~.shm_plane.SharedMemoryPlane` — same host: the daemon's shared-memory slots are mapped into the
  engine and copied straight into / out of its KV tensors, under load leases and store grants.
* :class:`~.stream_plane.ByteStreamPlane` — any host: whole chunks travel as framed gRPC byte streams.

A data plane raises :class:`~tiercache.errors.TierCacheError` on daemon trouble; the connector turns that
into "0 tokens, recompute". Exceptions of the engine-side copies propagate after the lease is released or
the store aborted.

Primitives:
    Medium: where bytes are: the ENGINE's KV tensors, the daemon's SHARED_MEMORY slots or its BYTE_STREAM.
    DataPlane: load, load_layerwise, store, begin_save, prefill_publisher.
    PrefillPublisher: publish (store and make visible some chunks of a single-flight prefill), abort.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from enum import Enum, auto
from typing import ClassVar

from tiercache.keys import Namespace

from .client import TierCacheClient
from .config import ConnectorConfig
from .kv import EngineKV
from .layerwise import LayerwiseLoad, LayerwiseSave
from .outcomes import LoadResult, StoreResult
from .policy import WirePolicy


class Medium(Enum):
    """Where a transfer's bytes are: its source or its destination (a data plane is named by its daemon end)."""

    ENGINE = auto()
    """The engine's KV tensors (host or device memory)."""
    SHARED_MEMORY = auto()
    """The daemon's shared-memory slots, mapped into the engine's process."""
    BYTE_STREAM = auto()
    """The daemon's framed gRPC byte streams."""


class PrefillPublisher(ABC):
    """Publishes a single-flight prefill's led chunks as the engine computes them (one per claim)."""

    @property
    @abstractmethod
    def reserved(self) -> bool:
        """Whether room was reserved for the led chunks (a take-over would no longer fit it)."""

    @abstractmethod
    def publish(self, kv: EngineKV, positions: Sequence[int]) -> int:
        """Store the chunks at ``positions`` (of the prompt's keys) from ``kv`` and make them visible.

        Returns:
            How many of them this request added (the others were cached or stored by someone else).

        Raises:
            TierCacheError: daemon trouble (nothing more is published).
        """

    @abstractmethod
    def abort(self) -> None:
        """Drop what was reserved and not published (best effort; never raises)."""


class DataPlane(ABC):
    """Moves one namespace's chunks between the daemon and the engine's KV tensors.

    Attributes:
        client: the daemon client.
        namespace: the namespace.
        config: the connector's options (codec, TTLs).
        clock: the monotonic clock leases are measured with.
    """

    kind: ClassVar[Medium]
    """The daemon's end of this plane's transfers (the engine's is :attr:`Medium.ENGINE`)."""

    def __init__(
        self,
        client: TierCacheClient,
        namespace: Namespace,
        config: ConnectorConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.config = config
        self.clock = clock

    @property
    def remote(self) -> bool:
        """True for the byte stream (what results report as ``remote``)."""
        return self.kind is Medium.BYTE_STREAM

    @abstractmethod
    def load(self, keys: Sequence[bytes], kv: EngineKV, policy: WirePolicy, prompt_tokens: int) -> LoadResult:
        """Copy the cached prefix of ``keys`` that ``policy`` chooses into ``kv`` (already checked).

        Raises:
            TierCacheError: daemon trouble.
        """

    @abstractmethod
    def load_layerwise(
        self,
        keys: Sequence[bytes],
        kv: EngineKV,
        policy: WirePolicy,
        prompt_tokens: int,
        on_result: Callable[[LoadResult], None],
    ) -> LayerwiseLoad:
        """Start a layer-by-layer load of the cached prefix of ``keys`` into ``kv``.

        Raises:
            TierCacheError: daemon trouble before any copy started.
        """

    @abstractmethod
    def store(self, keys: Sequence[bytes], kv: EngineKV) -> StoreResult:
        """Store the chunks of ``keys`` the daemon does not hold yet from ``kv`` (already checked).

        Raises:
            TierCacheError: daemon trouble (nothing of this store becomes visible).
        """

    @abstractmethod
    def begin_save(self, keys: Sequence[bytes], cached: int | None = None) -> LayerwiseSave:
        """Reserve room for the new chunks of ``keys``, to be filled layer by layer (or chunk by chunk) and
        committed.

        Args:
            keys: the prompt's chunk keys.
            cached: the first ``cached`` chunks are known to be cached (an engine that looked the prompt up
                already): only ``keys[cached:]`` are reserved, and nothing is looked up; None: the plane
                finds out.

        Raises:
            TierCacheError: daemon trouble.
        """

    @abstractmethod
    def prefill_publisher(self, keys: Sequence[bytes], start: int) -> PrefillPublisher:
        """A publisher of the led chunks ``keys[start:]`` of a single-flight prefill."""
