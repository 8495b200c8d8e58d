"""A Lookup's keys go packed into one field only to a daemon that says it reads them so; to an older daemon
as the repeated field. Against a real daemon, both forms give the same answer."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from tiercache.connector import ConnectorConfig, KVConnector, TierCacheClient, rpcs
from tiercache.connector.control import ControlSocket
from tiercache.connector.requests import lookup_request
from tiercache.connector.results import Registration
from tiercache.errors import InvalidArgumentError
from tiercache.keys import chunk_keys

Daemon = Any  # tests/connector/conftest.py:Daemon
TOKENS = 16 * 40  # 40 chunks of the engine module's layout: long enough for the numpy path


def _with(reg: Registration, packed: bool) -> Registration:
    fields = {name: getattr(reg, name) for name in reg.__dataclass_fields__}
    return Registration(**{**fields, "packed_keys": packed})


def test_lookups_are_packed_only_for_a_daemon_that_reads_them(
    shared_daemon: Daemon, engine_mod: ModuleType
) -> None:
    with TierCacheClient.connect(shared_daemon.address) as client:
        ns = engine_mod.namespace("packed-keys")
        conn = KVConnector(client, ns, ConnectorConfig())
        tokens = engine_mod.prompt(901, TOKENS)
        keys = chunk_keys(ns, tokens)
        assert conn.store(tokens[: TOKENS - 16], engine_mod.source_kv(901, TOKENS - 16, True)).tokens_stored
        reg = client.registration(ns)
        assert reg.packed_keys  # this daemon reads them

        new = lookup_request(reg, keys, prefetch=True)
        assert new.packed_keys == b"".join(keys) and not new.keys and new.prefetch
        old = lookup_request(_with(reg, False), keys, prefetch=True)
        assert list(old.keys) == keys and not old.packed_keys and old.prefetch
        assert new.handle == old.handle == reg.handle

        # The client's own lookup, and each form sent as is, answer alike.
        info = client.lookup(ns, keys)
        assert info.chunks == len(keys) - 1
        control = ControlSocket(reg.control_socket, None)
        try:
            for request in (new, old):
                assert control.call(rpcs.LOOKUP, request, 10.0).chunks == info.chunks
        finally:
            control.close()


@pytest.mark.parametrize("packed", [True, False])
def test_a_malformed_key_is_refused_before_sending(packed: bool) -> None:
    from tiercache.layout import KVDtype, KVLayout

    layout = KVLayout(1, 1, 8, KVDtype.BFLOAT16, chunk_tokens=16)
    reg = Registration(b"h" * 16, layout, layout.chunk_bytes, None, 30.0, 1 << 20, "", packed)
    with pytest.raises(InvalidArgumentError, match=r"keys\[1\]: must be 32 bytes, got 3"):
        lookup_request(reg, [bytes(32), b"abc"], prefetch=False)
