"""A connector's data plane, chosen through the transfer handlers (:mod:`.handlers`), and chosen again.

Primitives:
    DataPlaneChoice: the data plane of one connector — fixed at once under ``shm`` or ``stream``; under
        ``auto`` chosen from the namespace's registration on first use and again only when the registration
        changed (the daemon restarted and the client registered the namespace again).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from tiercache.keys import Namespace

from .client import TierCacheClient
from .config import ConnectorConfig, DataPlaneMode
from .dataplane import DataPlane
from .handlers import daemon_medium, open_plane
from .results import Registration

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
        self._fixed: DataPlane | None = None
        self._plane: DataPlane | None = None
        self._chosen_for: Registration | None = None
        if config.data_plane is not DataPlaneMode.AUTO:
            self._fixed = self._open()

    def current(self) -> DataPlane:
        """The data plane to use now: the one asked for; under ``auto``, shared memory when the current
        registration's segment can be mapped in this process, else the byte stream.

        Raises:
            TierCacheError: the daemon could not be asked for the registration (down, refused it).
        """
        if self._fixed is not None:
            return self._fixed
        reg = self._client.registration(self._namespace)
        with self._lock:
            if self._plane is not None and self._chosen_for == reg:
                return self._plane
        plane = self._open()
        with self._lock:
            self._plane, self._chosen_for = plane, reg
        logger.info(
            "namespace %s: data plane %s (segment %s)",
            self._namespace.model_id,
            plane.kind.name,
            reg.segment.shm_segment if reg.segment else None,
        )
        return plane

    def _open(self) -> DataPlane:
        medium = daemon_medium(self._config.data_plane, self._mappable)
        return open_plane(medium, self._client, self._namespace, self._config, self._clock)

    def _mappable(self) -> bool:
        return self._client.slot_mapping(self._namespace) is not None
