"""The fd socket of the isolated data plane, in process over a real unix socket and a real L2 tier: a grant
is bound to its tenant, spent once, and useless without that tenant's token; bad requests are refused."""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tiercache.daemon.auth import Authenticator, load_tokens
from tiercache.daemon.fdserver import TenantPools
from tiercache.errors import PermissionDeniedError, UnavailableError
from tiercache.fdpass import request_segment
from tiercache.shm import SharedSegment
from tiercache.tiers.host import HostTier, HostTierConfig

from .conftest import write_tokens

SLOT = 4096


@pytest.fixture
def pools(tmp_path: Path) -> Iterator[tuple[TenantPools, HostTier]]:
    host = HostTier(
        HostTierConfig(
            capacity_bytes=4 * SLOT, slot_bytes=SLOT, segment_prefix=f"tc-fd-{secrets.token_hex(3)}"
        )
    )
    auth = Authenticator(load_tokens(str(write_tokens(tmp_path / "tokens.toml"))))
    p = TenantPools(host, auth, str(tmp_path / "d.sock.fd"), 0o600)
    p.start()
    yield p, host
    p.close()
    host.close()


def test_a_grant_gives_the_tenant_its_own_pool_once(pools: tuple[TenantPools, HostTier]) -> None:
    p, host = pools
    dp = p.register(b"a" * 16, "team-a")
    assert dp.fd_socket == p.socket_path and len(dp.fd_grant) == 16
    name, fd = request_segment(dp.fd_socket, "token-of-a", bytes(dp.fd_grant), 5.0)
    seg = SharedSegment.from_fd(name, fd)
    try:
        assert name == dp.shm_segment == host.segment_of("team-a").name
        seg.buffer[0] = 42  # the engine's writes land in the daemon's pool
        assert host.segment_of("team-a").buffer[0] == 42
    finally:
        seg.close()
    with pytest.raises(PermissionDeniedError, match="grant"):
        request_segment(dp.fd_socket, "token-of-a", bytes(dp.fd_grant), 5.0)  # spent


def test_another_tenants_token_or_a_bad_token_gets_nothing(pools: tuple[TenantPools, HostTier]) -> None:
    p, _ = pools
    dp = p.register(b"a" * 16, "team-a")
    with pytest.raises(PermissionDeniedError, match="unknown token"):
        request_segment(dp.fd_socket, "not-a-token", bytes(dp.fd_grant), 5.0)
    with pytest.raises(PermissionDeniedError, match="grant"):
        request_segment(dp.fd_socket, "token-of-b", bytes(dp.fd_grant), 5.0)  # B's token: refused (and spent)
    with pytest.raises(PermissionDeniedError, match="grant"):
        request_segment(dp.fd_socket, "token-of-a", bytes(dp.fd_grant), 5.0)
    with pytest.raises(PermissionDeniedError, match="missing"):
        request_segment(dp.fd_socket, None, bytes(p.register(b"a" * 16, "team-a").fd_grant), 5.0)


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        (b"not json\n", "request"),
        (b"[1]\n", "request"),
        (b'{"token": "token-of-a"}\n', "grant"),
        (b'{"grant": "zz"}\n', "grant"),
    ],
)
def test_malformed_requests_are_refused_naming_the_field(
    pools: tuple[TenantPools, HostTier], line: bytes, fragment: str
) -> None:
    p, _ = pools
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(5.0)
        conn.connect(p.socket_path)
        conn.sendall(line)
        reply, fds, _, _ = socket.recv_fds(conn, 8192, 1)
    assert fds == [] and b'"ok": false' in reply and fragment.encode() in reply


def test_close_removes_the_socket_and_a_missing_socket_is_unavailable(
    pools: tuple[TenantPools, HostTier],
) -> None:
    p, _ = pools
    dp = p.register(b"a" * 16, "team-a")
    p.close()
    assert not os.path.exists(p.socket_path)
    with pytest.raises(UnavailableError):
        request_segment(dp.fd_socket, "token-of-a", bytes(dp.fd_grant), 5.0)
