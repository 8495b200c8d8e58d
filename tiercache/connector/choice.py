"""The one place a connector's data plane is chosen (shared memory or byte stream), and chosen again.

Primitives:
    DataPlaneChoice: the data plane of one connector — the byte stream when forced (fixed at once), else
        chosen from the namespace's registration on first use and again only when the registration changed
        (the daemon restarted and the client registered the namespace again).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from tiercache.keys import Namespace

from .client import TierCacheClient
from .config import ConnectorConfig
from .dataplane import DataPlane
from .results import Registration
from .shm_plane import SharedMemoryPlane
from .stream_plane import ByteStreamPlane

logger = logging.getLogger(__name__)


class DataPlaneChoice:
    """Chooses and keeps one connector's data plane. Thread-safe."""

    def __init__(
        self,
        client: TierCacheClient,
        namespace: Namespace,
        config: ConnectorConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._namespace = namespace
        self._config = config
        self._clock = clock
        self._lock = threading.Lock()
        self._forced: DataPlane | None = None
        self._plane: DataPlane | None = None
        self._chosen_for: Registration | None = None
        if config.force_remote:
            self._forced = ByteStreamPlane(client, namespace, config)

    def current(self) -> DataPlane:
        """The data plane to use now: the forced byte stream; else shared memory when the current
        registration's segment can be mapped in this process, else the byte stream.

        Raises:
            TierCacheError: the daemon could not be asked for the registration (down, refused it).
        """
        if self._forced is not None:
            return self._forced
        reg = self._client.registration(self._namespace)
        with self._lock:
            if self._plane is not None and self._chosen_for == reg:
                return self._plane
        plane: DataPlane
        if self._client.slot_mapping(self._namespace) is not None:
            plane = SharedMemoryPlane(self._client, self._namespace, self._config, self._clock)
        else:
            plane = ByteStreamPlane(self._client, self._namespace, self._config)
        with self._lock:
            self._plane, self._chosen_for = plane, reg
        logger.info(
            "namespace %s: data plane %s (segment %s)",
            self._namespace.model_id,
            plane.kind.name,
            reg.segment.shm_segment if reg.segment else None,
        )
        return plane
