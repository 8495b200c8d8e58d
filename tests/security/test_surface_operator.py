"""The cache-wide views are the operator's: ``/metrics``, cache-wide Stats and Diagnostics need its token
or an explicit opt-in, and TCP without tokens needs an explicit opt-in too.

Today's attacks: another uid on the host reads ``/metrics`` on 127.0.0.1 and sees every tenant's figures
(``tiercache_tenant_*{tenant="team-a"}``); any caller drives Diagnostics' bulk streams (on by default); a
daemon with ``--tcp`` and no tokens file serves anyone who can reach the port. The other uid is real when
the tests run as root (``setpriv``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.daemon.conftest import (
    DAEMON_ARGS,
    RPC_TIMEOUT_S,
    TENANT_A,
    TENANT_B,
    base_args,
    make_keys,
    payload,
    register,
    shm_store,
    write_tokens,
)
from tiercache.proto import tiercache_pb2 as pb
from tiercache.proto import tiercache_pb2_grpc as pb_grpc
from tiercache.testing.daemon import DaemonProcess, free_port, hermetic_env
from tiercache.testing.plugin import make_daemon

ADMIN_TOKEN = "operator-token-0123456789"
OTHER_UID = 61_004
PLAIN_ARGS = tuple(a for a in DAEMON_ARGS if a != "--diagnostics")
"""This suite's daemon options with Diagnostics left at its default."""


def _admin_file(tmp: Path) -> Path:
    path = tmp / "admin.token"
    path.write_text(ADMIN_TOKEN + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[DaemonProcess, int]]:
    """Two tenants with chunks of their own, /metrics on a free port, the operator's token file set (today's
    daemon has no such option: it gets the same daemon without it)."""
    port = free_port()
    tokens = write_tokens(tmp_path / "tokens.toml")
    args = [*PLAIN_ARGS, "--tokens-file", str(tokens), "--metrics-port", str(port)]
    d = make_daemon(tmp_path, [*args, "--admin-token-file", str(_admin_file(tmp_path))])
    try:
        d.start()
    except Exception:  # an option today's daemon does not know
        d.cleanup()
        d = make_daemon(tmp_path, args)
        d.start()
    try:
        stub = d.stub()
        for who, seed in ((TENANT_A, 1), (TENANT_B, 2)):
            reg = register(stub, who)
            keys = make_keys(2, seed)
            assert shm_store(stub, reg, keys, [payload(i, seed) for i in range(2)], who) == 2
        yield d, port
    finally:
        d.cleanup()


def _scrape(port: int, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=RPC_TIMEOUT_S) as reply:
            return int(reply.status), reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _scrape_as_other_uid(port: int) -> str:
    """What another uid's plain GET of /metrics shows (root: through setpriv; else this user)."""
    code = (
        "import urllib.request,sys\n"
        "try: print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())\n"
        "except Exception as e: print('REFUSED', e)\n"
    )
    cmd = [sys.executable if os.geteuid() != 0 else "/usr/bin/python3", "-c", code]
    if os.geteuid() == 0 and shutil.which("setpriv"):
        cmd = ["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups", *cmd]
    url = f"http://127.0.0.1:{port}/metrics"
    return subprocess.run([*cmd, url], capture_output=True, text=True, timeout=60).stdout


def test_metrics_need_the_operators_token(daemon: tuple[DaemonProcess, int]) -> None:
    _, port = daemon
    seen = _scrape_as_other_uid(port)
    assert 'tenant="team-a"' not in seen and seen.startswith("REFUSED") and "401" in seen
    assert _scrape(port)[0] == 401
    assert _scrape(port, "token-of-a")[0] == 401  # a tenant's token is not the operator's
    code, body = _scrape(port, ADMIN_TOKEN)
    assert code == 200 and 'tenant="team-a"' in body and 'tenant="team-b"' in body


def test_cache_wide_stats_are_the_operators(daemon: tuple[DaemonProcess, int]) -> None:
    d, _ = daemon
    stub = d.stub()
    own = stub.Stats(pb.StatsRequest(), timeout=RPC_TIMEOUT_S, metadata=TENANT_A)
    operator = (("authorization", f"Bearer {ADMIN_TOKEN}"),)
    whole = stub.Stats(pb.StatsRequest(), timeout=RPC_TIMEOUT_S, metadata=operator)
    l2 = {t.tier: t.chunks for t in whole.tiers}[pb.TIER_L2]
    assert {t.tier: t.chunks for t in own.tiers}[pb.TIER_L2] == 2 and l2 == 4


def test_diagnostics_are_off_unless_enabled(daemon: tuple[DaemonProcess, int]) -> None:
    d, _ = daemon
    echo = pb_grpc.DiagnosticsStub(d.channel())
    with pytest.raises(grpc.RpcError) as caught:
        list(
            echo.SourceStream(
                pb.SourceRequest(message_bytes=1 << 16, count=64), timeout=RPC_TIMEOUT_S, metadata=TENANT_B
            )
        )
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_tcp_without_tokens_needs_an_explicit_opt_in(tmp_path: Path) -> None:
    prefix = "tiercache-test-optin"
    argv = [sys.executable, "-m", "tiercache.daemon", *base_args(tmp_path, prefix, tmp_path / "l3")]
    argv = [a for a in argv if a != "--diagnostics"] + ["--tcp", f"127.0.0.1:{free_port()}"]
    try:
        out = subprocess.run(argv, env=hermetic_env(), capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(
            "the daemon started a TCP listener without tokens and without --allow-unauthenticated-tcp"
        )
    finally:
        for path in Path("/dev/shm").glob(prefix + ".*"):
            path.unlink()
    assert out.returncode == 2
    assert "--allow-unauthenticated-tcp: refusing a TCP listener on 127.0.0.1:" in out.stderr


def test_metrics_without_operator_token_need_an_explicit_opt_in(tmp_path: Path) -> None:
    prefix = "tiercache-test-metrics"
    argv = [sys.executable, "-m", "tiercache.daemon", *base_args(tmp_path, prefix, tmp_path / "l3")]
    argv += ["--metrics-port", str(free_port())]
    try:
        out = subprocess.run(argv, env=hermetic_env(), capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the daemon served /metrics to anyone without --metrics-public")
    finally:
        for path in Path("/dev/shm").glob(prefix + ".*"):
            path.unlink()
    assert out.returncode == 2 and "--metrics-public: /metrics on port" in out.stderr
