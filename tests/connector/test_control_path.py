"""A connector against a real daemon sends its unary calls over the daemon's control socket, loads bit-exactly
through it, goes back to gRPC when the socket cannot be reached, and can be told to use gRPC only."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

from tiercache.connector import ClientConfig, ConnectorConfig, KVConnector, TierCacheClient

Daemon = Any  # tests/connector/conftest.py:Daemon
TOKENS = 64


def _round_trip(client: TierCacheClient, engine: ModuleType, seed: int) -> None:
    conn = KVConnector(client, engine.namespace(f"ctl-{seed}"), ConnectorConfig())
    tokens = engine.prompt(seed, TOKENS)
    assert conn.store(tokens, engine.source_kv(seed, TOKENS, True)).tokens_stored == TOKENS
    kv = engine.empty_kv(seed, TOKENS, False)
    assert conn.load(tokens, kv).tokens_loaded == TOKENS
    assert engine.exact(kv, seed, TOKENS, TOKENS)


def _connected_lines(daemon: Daemon) -> int:
    return daemon.log.read_text().count(f"control socket: engine pid={os.getpid()} ")


def test_calls_go_over_the_control_socket_and_back_to_grpc_when_it_is_gone(
    daemon_factory: Callable[..., Daemon], engine_mod: ModuleType, caplog: pytest.LogCaptureFixture
) -> None:
    daemon = daemon_factory()
    daemon.start()
    with TierCacheClient.connect(daemon.address, config=ClientConfig(control_socket=False)) as grpc_only:
        _round_trip(grpc_only, engine_mod, 801)
    assert _connected_lines(daemon) == 0
    with TierCacheClient.connect(daemon.address) as client:
        _round_trip(client, engine_mod, 802)
        assert _connected_lines(daemon) >= 1
        os.unlink(f"{daemon.socket}.ctl")
        _round_trip(client, engine_mod, 803)  # its connection is still open: the socket file is not needed
    with (
        caplog.at_level(logging.WARNING, logger="tiercache.connector.connection"),
        TierCacheClient.connect(daemon.address) as fresh,
    ):
        _round_trip(fresh, engine_mod, 804)  # cannot connect: gRPC instead, nothing fails
    assert "calls go through gRPC" in caplog.text
