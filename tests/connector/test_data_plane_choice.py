"""The data plane is chosen once per connector, against a real daemon: the one asked for under ``shm`` or
``stream`` (fixed at construction), under ``auto`` shared memory when its segment can be mapped here,
chosen again only after the daemon restarted and the namespace was registered again. Loads through each are
bit-exact."""

from __future__ import annotations

import signal
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tiercache.connector import (
    ClientConfig,
    ConnectorConfig,
    DataPlaneMode,
    KVConnector,
    LoadPolicy,
    Medium,
    TierCacheClient,
)
from tiercache.connector.dataplane import DataPlane
from tiercache.connector.shm_plane import SharedMemoryPlane
from tiercache.connector.stream_plane import ByteStreamPlane
from tiercache.errors import UnavailableError
from tiercache.testing.waits import wait_until

Daemon = Any  # tests/connector/conftest.py:Daemon
TOKENS = 64
WAIT_S = 30.0


def _connector(address: str, engine: ModuleType, salt: str, **cfg: Any) -> KVConnector:
    client = TierCacheClient.connect(address, config=ClientConfig(timeout_s=10.0))
    return KVConnector(client, engine.namespace(salt), ConnectorConfig(**cfg))


@pytest.mark.parametrize(
    ("mode", "want"),
    [(DataPlaneMode.STREAM, ByteStreamPlane), (DataPlaneMode.SHM, SharedMemoryPlane)],
    ids=["stream", "shm"],
)
def test_an_asked_plane_is_fixed_at_construction(
    tmp_path: Path, engine_mod: ModuleType, mode: DataPlaneMode, want: type[DataPlane]
) -> None:
    conn = _connector(f"unix:{tmp_path / 'nobody.sock'}", engine_mod, "forced", data_plane=mode)
    plane = conn.data_plane()  # no daemon needed: nothing is asked
    assert type(plane) is want and plane.remote is (mode is DataPlaneMode.STREAM)
    assert conn.data_plane() is plane
    chooser = _connector(f"unix:{tmp_path / 'nobody.sock'}", engine_mod, "unforced")
    with pytest.raises(UnavailableError):
        chooser.data_plane()  # the choice needs the daemon's registration
    conn.client.close()
    chooser.client.close()


@pytest.mark.parametrize("mode", list(DataPlaneMode), ids=[m.value for m in DataPlaneMode])
def test_every_call_of_a_connector_uses_the_one_plane(
    shared_daemon: Daemon, engine_mod: ModuleType, mode: DataPlaneMode
) -> None:
    remote = mode is DataPlaneMode.STREAM
    seed = 700 + list(DataPlaneMode).index(mode)
    salt = f"choice-{mode.value}"
    conn = _connector(shared_daemon.address, engine_mod, salt, data_plane=mode)
    plane = conn.data_plane()
    want = ByteStreamPlane if remote else SharedMemoryPlane
    assert type(plane) is want and plane.remote is remote
    tokens = engine_mod.prompt(seed, TOKENS)
    stored = conn.store(tokens, engine_mod.source_kv(seed, TOKENS, True))
    assert (stored.tokens_stored, stored.remote) == (TOKENS, remote)
    for paged in (False, True):
        kv = engine_mod.empty_kv(seed, TOKENS, paged)
        loaded = conn.load(tokens, kv)
        assert (loaded.tokens_loaded, loaded.remote) == (TOKENS, remote)
        assert engine_mod.exact(kv, seed, TOKENS, TOKENS)
    kv = engine_mod.empty_kv(seed, TOKENS, False)
    with conn.load_layerwise(tokens, kv, LoadPolicy.best_effort()) as load:
        result = load.result(timeout_s=WAIT_S)
    assert (result.tokens_loaded, result.remote) == (TOKENS, remote)
    assert engine_mod.exact(kv, seed, TOKENS, TOKENS)
    assert conn.data_plane() is plane  # chosen once: every call above went through it
    conn.client.close()


def test_the_plane_is_chosen_again_after_a_daemon_restart(daemon: Daemon, engine_mod: ModuleType) -> None:
    conn = _connector(daemon.address, engine_mod, "restart")
    tokens = engine_mod.prompt(710, TOKENS)
    assert conn.store(tokens, engine_mod.source_kv(710, TOKENS, False)).tokens_stored == TOKENS
    before = conn.data_plane()
    assert conn.data_plane() is before and before.kind is Medium.SHARED_MEMORY
    old_segment = conn.client.registration(conn.namespace).segment
    assert daemon.stop(signal.SIGTERM) == 0
    daemon.start()
    kvs = []

    def loaded() -> bool:
        kv = engine_mod.empty_kv(710, TOKENS, False)
        kvs.append(kv)
        return conn.load(tokens, kv).tokens_loaded == TOKENS

    wait_until(loaded, WAIT_S, "a load from the restarted daemon (L3)")
    assert engine_mod.exact(kvs[-1], 710, TOKENS, TOKENS)
    assert conn.client.registration(conn.namespace).segment != old_segment
    after = conn.data_plane()
    assert after is not before and after.kind is Medium.SHARED_MEMORY
    kv = engine_mod.empty_kv(710, TOKENS, True)
    assert conn.load(tokens, kv).tokens_loaded == TOKENS and engine_mod.exact(kv, 710, TOKENS, TOKENS)
    assert conn.data_plane() is after  # and kept from then on
    conn.client.close()
