"""Transfer handlers, registered by (source medium, destination medium), and the one resolution of an
engine's data-plane mode against what the daemon offers.

A handler is a :class:`~.dataplane.DataPlane`: it moves one namespace's chunks between the engine's KV
tensors (:attr:`~.dataplane.Medium.ENGINE`, contiguous or paged: :mod:`.kv`) and the daemon, both ways
(loads and saves), through one daemon medium. Engine adapters (:class:`~.engine.KVConnector`, the vLLM
scheduler and worker) turn engine events into transfers; which handler moves the bytes is decided here
only:

* ``shm`` asks for the daemon's shared memory, ``stream`` for its byte stream;
* ``auto`` takes shared memory when the daemon offers it to this process (its registration names a
  segment — the worker and :class:`~.choice.DataPlaneChoice` also require that it can be mapped here),
  else the byte stream.

Primitives:
    daemon_medium: the daemon's medium for a mode and an offer (asked only under ``auto``).
    handler: the handler class registered for a (source, destination) pair; an unregistered pair fails.
    open_plane: the handler of a daemon medium, built for a namespace.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tiercache.errors import InvalidArgumentError
from tiercache.keys import Namespace

from .client import TierCacheClient
from .config import ConnectorConfig, DataPlaneMode
from .dataplane import DataPlane, Medium
from .shm_plane import SharedMemoryPlane
from .stream_plane import ByteStreamPlane

_HANDLERS: dict[tuple[Medium, Medium], type[DataPlane]] = {
    (Medium.SHARED_MEMORY, Medium.ENGINE): SharedMemoryPlane,
    (Medium.ENGINE, Medium.SHARED_MEMORY): SharedMemoryPlane,
    (Medium.BYTE_STREAM, Medium.ENGINE): ByteStreamPlane,
    (Medium.ENGINE, Medium.BYTE_STREAM): ByteStreamPlane,
}
"""Every handler is registered both ways: one plane object serves a namespace's loads and its saves."""

_ASKED: dict[DataPlaneMode, Medium] = {
    DataPlaneMode.SHM: Medium.SHARED_MEMORY,
    DataPlaneMode.STREAM: Medium.BYTE_STREAM,
}


def daemon_medium(mode: DataPlaneMode, offered: Callable[[], bool]) -> Medium:
    """The daemon's medium of the transfers of an engine that asks for ``mode``.

    Args:
        mode: ``shm`` or ``stream``: that medium; ``auto``: shared memory when ``offered()`` (called only
            then), else the byte stream.
        offered: whether the daemon offers its shared memory to this process.
    """
    asked = _ASKED.get(mode)
    if asked is not None:
        return asked
    return Medium.SHARED_MEMORY if offered() else Medium.BYTE_STREAM


def handler(source: Medium, destination: Medium) -> type[DataPlane]:
    """The handler class registered for transfers from ``source`` to ``destination``.

    Raises:
        InvalidArgumentError: no handler moves bytes between them (the message lists the registered pairs).
    """
    found = _HANDLERS.get((source, destination))
    if found is None:
        pairs = ", ".join(f"{s.name}->{d.name}" for s, d in _HANDLERS)
        raise InvalidArgumentError(
            "medium", f"no transfer handler from {source.name} to {destination.name}; registered: {pairs}"
        )
    return found


def open_plane(
    medium: Medium,
    client: TierCacheClient,
    namespace: Namespace,
    config: ConnectorConfig,
    clock: Callable[[], float] = time.monotonic,
) -> DataPlane:
    """The handler of ``namespace``'s transfers between the daemon's ``medium`` and the engine (both ways).

    Raises:
        InvalidArgumentError: ``medium`` is not a daemon medium.
    """
    return handler(medium, Medium.ENGINE)(client, namespace, config, clock)
