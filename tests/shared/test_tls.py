"""The shared tier over TLS: a real ``redis-server`` that listens on a TLS port only (certificates from
:mod:`tests.daemon.certs`), reached through a ``rediss://`` URL with the CA as redis-py reads it from the URL.

A chunk round-trips bit-exactly through it with mutual TLS (the client library's TLS connection); a client
that trusts another CA, has no client certificate, or speaks plain text to the TLS port gets nothing: the failure is a
counted error of the tier (it turns itself off), never an exception into the cache or a wrong byte.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import torch

from tests.daemon.certs import Pki, make_pki
from tiercache.errors import CapacityError
from tiercache.testing.daemon import free_port
from tiercache.tiers.shared import SharedTier, SharedTierConfig

SIZE = 256 << 10
START_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Pki]]:
    """A redis-server with a TLS port only that requires client certificates; its port and PKI."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server)")
    work = tmp_path_factory.mktemp("shared-tls")
    pki, port = make_pki(work / "pki"), free_port()
    argv = [exe, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
            "--tls-cert-file", str(pki.server_cert), "--tls-key-file", str(pki.server_key),
            "--tls-ca-cert-file", str(pki.ca), "--tls-auth-clients", "yes",
            "--save", "", "--appendonly", "no", "--dir", str(work)]  # fmt: skip
    with open(work / "redis.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        probe = redis.Redis(
            host="127.0.0.1",
            port=port,
            ssl=True,
            ssl_ca_certs=str(pki.ca),
            ssl_certfile=str(pki.client_cert),
            ssl_keyfile=str(pki.client_key),
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.skip(f"redis-server did not start with TLS: {(work / 'redis.log').read_text()[-500:]}")
            try:
                probe.ping()
                break
            except redis.RedisError:
                assert time.monotonic() < deadline, "the TLS redis-server never answered"
                time.sleep(0.05)
        probe.close()
        yield port, pki
    finally:
        proc.terminate()
        proc.wait(10)


def _chunk(seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (SIZE,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def _round_trip(tier: SharedTier, cid: bytes, seed: int) -> list[bool]:
    (slot,) = tier.reserve([cid], [SIZE])
    slot.buffer.copy_(_chunk(seed))
    tier.commit([slot])
    dst = torch.zeros(SIZE, dtype=torch.uint8)
    found = tier.read_into([cid], [dst])
    assert not found[0] or torch.equal(dst, _chunk(seed)), "a chunk came back through TLS with wrong bytes"
    return found


def _url(scheme: str, port: int, ca: Path | None, client: Pki | None) -> str:
    url = f"{scheme}://127.0.0.1:{port}"
    if ca is not None:
        url += f"?ssl_cert_reqs=required&ssl_ca_certs={ca}"
    if client is not None:
        url += f"&ssl_certfile={client.client_cert}&ssl_keyfile={client.client_key}"
    return url


def test_a_rediss_url_round_trips_a_chunk_over_mutual_tls(tls_server: tuple[int, Pki]) -> None:
    port, pki = tls_server
    tier = SharedTier(SharedTierConfig(url=_url("rediss", port, pki.ca, pki), key_prefix="tls:"))
    try:
        assert _round_trip(tier, b"t" * 32, 7) == [True]
        assert tier.store_kind == "server" and tier.usage().errors == 0 and tier.available
    finally:
        tier.close()


@pytest.mark.parametrize("case", ["untrusted-ca", "no-client-certificate", "plaintext"])
def test_a_server_not_trusted_or_not_spoken_to_in_tls_is_a_counted_error(
    tls_server: tuple[int, Pki], case: str
) -> None:
    port, pki = tls_server
    url = {
        "untrusted-ca": _url("rediss", port, pki.other_ca, pki),
        "no-client-certificate": _url("rediss", port, pki.ca, None),
        "plaintext": _url("redis", port, None, None),
    }[case]
    tier = SharedTier(SharedTierConfig(url=url, key_prefix="tls-bad:"))
    try:
        (slot,) = tier.reserve([b"b" * 32], [SIZE])
        slot.buffer.copy_(_chunk(8))
        with pytest.raises(CapacityError, match="did not take"):  # what a write-down counts as dropped
            tier.commit([slot])
        tier.abort([slot])
        dst = torch.zeros(SIZE, dtype=torch.uint8)
        assert tier.read_into([b"b" * 32], [dst]) == [False] and int(dst.sum()) == 0
        assert tier.usage().errors >= 1 and not tier.available
    finally:
        tier.close()
