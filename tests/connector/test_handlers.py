"""The transfer-handler registry: every data-plane mode, with and without the daemon's offer of shared
memory, resolves to the handler the engine adapters have always used; the offer is asked only under
``auto``; every handler serves both directions; a pair no handler moves bytes between fails, naming the
registered ones."""

from __future__ import annotations

import pytest

from tiercache.connector import DataPlaneMode, Medium
from tiercache.connector.dataplane import DataPlane
from tiercache.connector.handlers import daemon_medium, handler
from tiercache.connector.shm_plane import SharedMemoryPlane
from tiercache.connector.stream_plane import ByteStreamPlane
from tiercache.errors import InvalidArgumentError

CASES = [
    (DataPlaneMode.AUTO, True, SharedMemoryPlane),
    (DataPlaneMode.AUTO, False, ByteStreamPlane),
    (DataPlaneMode.SHM, True, SharedMemoryPlane),
    (DataPlaneMode.SHM, False, SharedMemoryPlane),
    (DataPlaneMode.STREAM, True, ByteStreamPlane),
    (DataPlaneMode.STREAM, False, ByteStreamPlane),
]


@pytest.mark.parametrize(("mode", "offered", "want"), CASES, ids=[f"{m.value}-{o}" for m, o, _ in CASES])
def test_each_mode_and_offer_resolves_to_its_handler(
    mode: DataPlaneMode, offered: bool, want: type[DataPlane]
) -> None:
    asked: list[bool] = []

    def offer() -> bool:
        asked.append(offered)
        return offered

    medium = daemon_medium(mode, offer)
    assert medium is want.kind
    assert handler(medium, Medium.ENGINE) is want  # loads
    assert handler(Medium.ENGINE, medium) is want  # saves: the same plane object serves both
    assert asked == ([offered] if mode is DataPlaneMode.AUTO else [])


@pytest.mark.parametrize(
    ("source", "destination"),
    [
        (Medium.ENGINE, Medium.ENGINE),
        (Medium.SHARED_MEMORY, Medium.BYTE_STREAM),
        (Medium.BYTE_STREAM, Medium.SHARED_MEMORY),
        (Medium.SHARED_MEMORY, Medium.SHARED_MEMORY),
    ],
)
def test_an_unregistered_pair_fails_naming_the_registered_ones(source: Medium, destination: Medium) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        handler(source, destination)
    assert err.value.field == "medium"
    message = str(err.value)
    assert f"no transfer handler from {source.name} to {destination.name}" in message
    assert "SHARED_MEMORY->ENGINE" in message and "ENGINE->BYTE_STREAM" in message
