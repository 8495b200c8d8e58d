"""TLS on the daemon's TCP listener, against real daemon processes and throwaway certificates: a TLS client
connects (and still needs its token), a mutual-TLS daemon refuses a client without a certificate, a plaintext
client and a client that trusts another CA are refused, and tokens + plaintext TCP refuse to start unless
the operator allows it explicitly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from tests.daemon.certs import Pki, make_pki
from tests.daemon.conftest import RPC_TIMEOUT_S, StartDaemon, base_args, free_port, write_tokens
from tiercache.connector import ChannelConfig, ClientConfig, TierCacheClient
from tiercache.connector.config import ClientTls
from tiercache.daemon.config import ConfigError
from tiercache.daemon.options import load_config
from tiercache.errors import InvalidArgumentError, PermissionDeniedError, UnavailableError
from tiercache.proto import tiercache_pb2 as pb
from tiercache.proto import tiercache_pb2_grpc as pb_grpc

TOKEN_A = "token-of-a"


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


def _client(address: str, tls: ClientTls | None, token: str | None = TOKEN_A) -> TierCacheClient:
    config = ClientConfig(timeout_s=RPC_TIMEOUT_S, channel=ChannelConfig(tls=tls))
    return TierCacheClient.connect(address, token=token, config=config)


def _tls_daemon(start_daemon: StartDaemon, tmp_path: Path, pki: Pki, *extra: str) -> str:
    port = free_port()
    tokens = write_tokens(tmp_path / "tokens.toml")
    d = start_daemon(
        "--tokens-file", str(tokens), "--tcp", f"127.0.0.1:{port}",
        "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key), *extra,
    )  # fmt: skip
    scheme = "mtls" if extra else "tls"
    assert f"{scheme}:127.0.0.1:{port}" in d.stderr()
    return f"127.0.0.1:{port}"


def _plaintext_stats(address: str) -> grpc.RpcError:
    with grpc.insecure_channel(address) as ch, pytest.raises(grpc.RpcError) as info:
        pb_grpc.KVCacheServiceStub(ch).Stats(
            pb.StatsRequest(), timeout=5, metadata=[("authorization", f"Bearer {TOKEN_A}")]
        )
    return info.value


def test_tls_connect_and_plaintext_refused(start_daemon: StartDaemon, tmp_path: Path, pki: Pki) -> None:
    address = _tls_daemon(start_daemon, tmp_path, pki)
    with _client(address, ClientTls(ca_file=str(pki.ca))) as client:
        assert len(client.stats().tiers) == 3
    no_token = _client(address, ClientTls(ca_file=str(pki.ca)), token=None)
    with no_token as client, pytest.raises(PermissionDeniedError):  # TLS does not replace the token
        client.stats()
    assert _plaintext_stats(address).code() == grpc.StatusCode.UNAVAILABLE
    with _client(address, None) as client, pytest.raises(UnavailableError):
        client.stats()
    untrusted = _client(address, ClientTls(ca_file=str(pki.other_ca)))  # a server it cannot verify
    with untrusted as client, pytest.raises(UnavailableError):
        client.stats()


def test_mutual_tls(start_daemon: StartDaemon, tmp_path: Path, pki: Pki) -> None:
    address = _tls_daemon(start_daemon, tmp_path, pki, "--tls-client-ca", str(pki.ca))
    mutual = ClientTls(ca_file=str(pki.ca), cert_file=str(pki.client_cert), key_file=str(pki.client_key))
    with _client(address, mutual) as client:
        assert len(client.stats().tiers) == 3
    no_cert = _client(address, ClientTls(ca_file=str(pki.ca)))  # no client certificate
    with no_cert as client, pytest.raises(UnavailableError):
        client.stats()
    assert _plaintext_stats(address).code() == grpc.StatusCode.UNAVAILABLE


def test_tokens_with_plaintext_tcp_refuse_to_start(tmp_path: Path) -> None:
    tokens = write_tokens(tmp_path / "tokens.toml")
    args = [
        *base_args(tmp_path, "tiercache-test-plain", tmp_path / "l3"),
        "--tokens-file", str(tokens), "--tcp", f"127.0.0.1:{free_port()}",
    ]  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "tiercache.daemon", *args], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2, out.stderr
    assert "--allow-plaintext-tcp: refusing a plaintext TCP listener" in out.stderr
    assert not (tmp_path / "d.sock").exists()


def test_plaintext_tcp_with_tokens_when_allowed(start_daemon: StartDaemon, tmp_path: Path) -> None:
    port = free_port()
    tokens = write_tokens(tmp_path / "tokens.toml")
    d = start_daemon("--tokens-file", str(tokens), "--tcp", f"127.0.0.1:{port}", "--allow-plaintext-tcp")
    assert f"tcp:127.0.0.1:{port}" in d.stderr()
    with _client(f"127.0.0.1:{port}", None) as client:
        assert len(client.stats().tiers) == 3


@pytest.mark.parametrize(
    ("argv", "option", "fragment"),
    [
        (["--tcp", "127.0.0.1:1", "--tls-cert", "c.pem"], "tls_key", "--tls-cert and --tls-key go together"),
        (["--tcp", "127.0.0.1:1", "--tls-key", "k.pem"], "tls_cert", "--tls-cert and --tls-key go together"),
        (["--tcp", "127.0.0.1:1", "--tls-client-ca", "ca.pem"], "tls_client_ca", "mutual TLS needs"),
        (["--tls-cert", "c.pem", "--tls-key", "k.pem"], "tls_cert", "--tcp is empty"),
    ],
)
def test_tls_options_checked(argv: list[str], option: str, fragment: str, tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path)}
    with pytest.raises(ConfigError) as info:
        load_config(["--l1-device", "none", "--l2-bytes", "64M", "--l3-path", "", *argv], env)
    assert info.value.option == option
    assert fragment in str(info.value)


def test_client_tls_checked(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        ClientTls(cert_file="c.pem")
    assert info.value.field == "key_file"
    with pytest.raises(InvalidArgumentError) as info:
        ClientTls(ca_file=str(tmp_path / "missing.pem")).credentials()
    assert info.value.field == "ca_file"


def test_an_unreadable_certificate_stops_the_start(tmp_path: Path, pki: Pki) -> None:
    args = [
        *base_args(tmp_path, "tiercache-test-badcert", tmp_path / "l3"),
        "--tcp", f"127.0.0.1:{free_port()}", "--tls-cert", str(tmp_path / "missing.pem"),
        "--tls-key", str(pki.server_key), "--allow-unauthenticated-tcp",
    ]  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "tiercache.daemon", *args], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 1, out.stderr
    assert f"--tls-cert: cannot read {tmp_path / 'missing.pem'}" in out.stderr
    assert not list(Path("/dev/shm").glob("tiercache-test-badcert.*"))
