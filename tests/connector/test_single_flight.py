"""Single-flight prefill through the connector and a real daemon: a leader engine process killed with
SIGKILL loses its claim at the TTL and a follower takes over; an aborting leader is taken over at once;
followers go on as soon as the shared chunks are published while the leader still computes the rest."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from tiercache.connector import ClientConfig, ConnectorConfig, ContiguousKV, KVConnector, TierCacheClient

Daemon = Any  # tests/connector/conftest.py:Daemon
WAIT_S = 30.0


def _connector(address: str, engine: ModuleType, salt: str) -> KVConnector:
    client = TierCacheClient.connect(address, config=ClientConfig(timeout_s=10.0))
    return KVConnector(client, engine.namespace(salt), ConnectorConfig(prefill_ttl_s=10.0))


def _exact(engine: ModuleType, kv: ContiguousKV, seed: int, n: int, upto: int) -> bool:
    return bool(engine.exact(kv, seed, n, upto))


def test_a_killed_leader_is_taken_over_at_its_ttl(
    shared_daemon: Daemon,
    engine_mod: ModuleType,
    spawn_engine: Callable[..., tuple[Any, dict[str, Any]]],
) -> None:
    n, seed = 48, 501
    proc, info = spawn_engine(
        mode="claim", address=shared_daemon.address, seed=seed, tokens=n, salt="death", ttl_s=1.0
    )
    assert info == {"lead": n, "leader": True}
    follower = _connector(shared_daemon.address, engine_mod, "death")
    tokens = engine_mod.prompt(seed, n)
    before = follower.client.stats().prefill
    with follower.prefill_claim(tokens) as claim:
        assert (claim.wait_tokens, claim.lead_tokens, claim.leader) == (n, 0, False)
        proc.send_signal(signal.SIGKILL)
        proc.wait(WAIT_S)
        started = time.monotonic()
        assert claim.wait(timeout_s=20.0) == 0
        assert time.monotonic() - started < 10.0, "the wait should end at the leader's 1 s TTL, not at 20 s"
        assert (claim.leader, claim.lead_tokens, claim.takeover_tokens) == (True, n, n)
        kv = engine_mod.source_kv(seed, n, False)
        assert claim.publish(kv, n) == n
    after = follower.client.stats().prefill
    assert after.expired_claims >= before.expired_claims + 1
    assert after.takeovers >= before.takeovers + n // 16
    out = engine_mod.empty_kv(seed, n, False)
    assert _connector(shared_daemon.address, engine_mod, "death").load(tokens, out).tokens_loaded == n
    assert _exact(engine_mod, out, seed, n, n)


def test_an_aborting_leader_is_taken_over_at_once(shared_daemon: Daemon, engine_mod: ModuleType) -> None:
    n, seed = 32, 502
    tokens = engine_mod.prompt(seed, n)
    leader = _connector(shared_daemon.address, engine_mod, "abort")
    follower = _connector(shared_daemon.address, engine_mod, "abort")
    lead = leader.prefill_claim(tokens)
    assert lead.leader and lead.lead_tokens == n
    with follower.prefill_claim(tokens) as claim:
        assert claim.wait_tokens == n
        threading.Timer(0.2, lead.release).start()  # the leader's request is cancelled
        assert claim.wait(timeout_s=20.0) == 0
        assert claim.leader and claim.takeover_tokens == n


def test_followers_go_on_when_the_shared_chunks_are_published(
    shared_daemon: Daemon, engine_mod: ModuleType
) -> None:
    n, shared, seed = 64, 32, 503
    tokens = engine_mod.prompt(seed, n)
    leader = _connector(shared_daemon.address, engine_mod, "incremental")
    follower = _connector(shared_daemon.address, engine_mod, "incremental")
    kv = engine_mod.source_kv(seed, n, False)
    with leader.prefill_claim(tokens) as lead:
        assert lead.lead_tokens == n
        short = follower.prefill_claim(tokens[:shared])  # its prompt shares the first two chunks only
        assert (short.wait_tokens, short.lead_tokens) == (shared, 0)
        got: list[int] = []
        waiter = threading.Thread(target=lambda: got.append(short.wait(timeout_s=20.0)))
        waiter.start()
        assert lead.publish(kv, 16) == 16
        assert lead.publish(kv, 40) == shared  # 40 tokens computed: chunk 2 is not complete yet
        waiter.join(WAIT_S)
        assert got == [shared]  # while the leader still computes chunks 2 and 3
        out = engine_mod.empty_kv(seed, n, False)
        assert follower.load(tokens[:shared], out).tokens_loaded == shared
        assert _exact(engine_mod, out, seed, n, shared)
        assert lead.publish(kv, n) == n
    assert follower.lookup(tokens) == n
