"""Address parsing, channel options, bearer-token metadata, and waiting for a daemon to answer."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from tiercache.connector import TierCacheClient
from tiercache.connector.channel import ChannelConfig, Endpoint, auth_metadata, parse_address
from tiercache.errors import InvalidArgumentError
from tiercache.testing.daemon import DaemonProcess as Daemon


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("unix:/run/tc.sock", Endpoint("unix:/run/tc.sock", unix_path="/run/tc.sock")),
        ("unix:///run/tc.sock", Endpoint("unix:/run/tc.sock", unix_path="/run/tc.sock")),
        ("/tmp/d.sock", Endpoint("unix:/tmp/d.sock", unix_path="/tmp/d.sock")),
        ("  /tmp/d.sock ", Endpoint("unix:/tmp/d.sock", unix_path="/tmp/d.sock")),
        ("localhost:50051", Endpoint("localhost:50051", host="localhost", port=50051)),
        ("tcp://10.0.0.2:7000", Endpoint("10.0.0.2:7000", host="10.0.0.2", port=7000)),
        ("tcp://cache.local:7000/", Endpoint("cache.local:7000", host="cache.local", port=7000)),
        ("[::1]:9000", Endpoint("[::1]:9000", host="::1", port=9000)),
        ("tcp://[fe80::1]:1", Endpoint("[fe80::1]:1", host="fe80::1", port=1)),
    ],
)
def test_valid_addresses(address: str, expected: Endpoint) -> None:
    assert parse_address(address) == expected


def test_relative_socket_paths_become_absolute() -> None:
    ep = parse_address("./d.sock")
    assert ep.is_unix and ep.unix_path == os.path.abspath("d.sock")
    assert ep.target == "unix:" + os.path.abspath("d.sock")
    assert parse_address("unix:rel.sock").unix_path == os.path.abspath("rel.sock")
    assert not parse_address("h:1").is_unix


@pytest.mark.parametrize(
    "address",
    [
        "",
        "   ",
        "localhost",
        "host:0",
        "host:65536",
        "host:http",
        ":80",
        "::1:80",
        "http://h:80",
        "unix:",
        "unix://host/path",
        "[::1]9000",
        "tcp://h",
        "a b:80",
    ],
)
def test_invalid_addresses_name_the_argument(address: str) -> None:
    with pytest.raises(InvalidArgumentError, match=r"^address:"):
        parse_address(address)


def test_channel_options_carry_limits_and_short_backoff() -> None:
    opts = dict(
        ChannelConfig(max_message_bytes=8 << 20, connect_backoff_s=0.1, max_connect_backoff_s=2).options()
    )
    assert opts["grpc.max_send_message_length"] == 8 << 20
    assert opts["grpc.max_receive_message_length"] == 8 << 20
    assert opts["grpc.initial_reconnect_backoff_ms"] == 100
    assert opts["grpc.max_reconnect_backoff_ms"] == 2000
    assert "grpc.keepalive_time_ms" not in opts
    assert dict(ChannelConfig(keepalive_s=10).options())["grpc.keepalive_time_ms"] == 10_000


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_message_bytes": 0}, "max_message_bytes"),
        ({"connect_backoff_s": 0}, "connect_backoff_s"),
        ({"connect_backoff_s": 3, "max_connect_backoff_s": 1}, "connect_backoff_s"),
        ({"keepalive_s": -1}, "keepalive_s"),
    ],
)
def test_bad_channel_config(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(InvalidArgumentError, match=f"^{field}:"):
        ChannelConfig(**kwargs)  # type: ignore[arg-type]


def test_auth_metadata() -> None:
    assert auth_metadata(None) == ()
    assert auth_metadata("s3cr3t") == (("authorization", "Bearer s3cr3t"),)
    for bad in ("", "a b", "x\n"):
        with pytest.raises(InvalidArgumentError, match=r"^token:"):
            auth_metadata(bad)


def test_wait_ready_leaves_no_thread_behind(shared_daemon: Daemon, tmp_path: Path) -> None:
    """A wait that timed out (the daemon is not up yet) leaves no thread polling the channel: grpc's
    connectivity poller, which ``channel_ready_future`` left running, failed with "Channel closed!" when the
    channel was closed under it."""
    threads = set(threading.enumerate())
    absent = TierCacheClient.connect(str(tmp_path / "absent.sock"))
    try:
        assert not absent.wait_ready(0.3)
        assert set(threading.enumerate()) <= threads
    finally:
        absent.close()
    client = TierCacheClient.connect(shared_daemon.address)
    try:
        assert client.wait_ready(10.0)
        assert set(threading.enumerate()) <= threads
    finally:
        client.close()
