"""StreamStore's optional key chain (field ``keys`` of the first message), against a real daemon process.

A stream that names its keys up front is reserved and committed as one ticket; one that does not (an older
client) still stores the same bytes. Keys that do not match the pieces that follow are refused with a
status naming the field, and nothing of such a stream becomes visible or stays reserved."""

from __future__ import annotations

from collections.abc import Sequence

import grpc
import pytest

from tests.daemon.conftest import (
    LAYOUT,
    RPC_TIMEOUT_S,
    make_keys,
    payload,
    shm_load,
    shm_store,
    stream_store_messages,
)
from tiercache.proto import tiercache_pb2 as pb
from tiercache.proto import tiercache_pb2_grpc as pb_grpc

CB = LAYOUT.chunk_bytes
Stub = pb_grpc.KVCacheServiceStub


def cached(stub: Stub, reg: pb.RegisterResponse, keys: Sequence[bytes]) -> int:
    reply = stub.Lookup(pb.LookupRequest(handle=reg.handle, keys=keys), timeout=RPC_TIMEOUT_S)
    return int(reply.chunks)


@pytest.mark.parametrize("zstd", [False, True], ids=["raw", "zstd"])
@pytest.mark.parametrize("named", [True, False], ids=["keys", "no-keys"])
def test_stream_store_round_trip_with_and_without_keys(
    stub: Stub, reg: pb.RegisterResponse, named: bool, zstd: bool
) -> None:
    seed = 200 + 2 * named + zstd
    keys = make_keys(4, seed=seed)
    chunks = [payload(i, seed=seed) for i in range(4)]
    messages = list(
        stream_store_messages(reg.handle, keys, chunks, 10_000, zstd=zstd, chain=keys if named else None)
    )
    assert len(messages) > len(keys)  # chunks span several pieces
    assert list(messages[0].keys) == (keys if named else [])
    reply = stub.StreamStore(iter(messages), timeout=RPC_TIMEOUT_S)
    assert reply.stored == 4 and list(reply.skipped) == []
    assert shm_load(stub, reg, keys) == chunks


def test_a_stream_with_keys_skips_cached_chunks(stub: Stub, reg: pb.RegisterResponse) -> None:
    keys = make_keys(3, seed=210)
    chunks = [payload(i, seed=210) for i in range(3)]
    assert shm_store(stub, reg, keys[:2], chunks[:2]) == 2
    other = [payload(i, seed=211) for i in range(3)]  # the cached chunks' pieces are dropped, not written
    reply = stub.StreamStore(
        stream_store_messages(reg.handle, keys, [*other[:2], chunks[2]], CB, chain=keys),
        timeout=RPC_TIMEOUT_S,
    )
    assert reply.stored == 1 and list(reply.skipped) == [0, 1]
    assert shm_load(stub, reg, keys) == chunks


def test_a_stream_with_keys_continues_a_chain_at_its_start_depth(
    stub: Stub, reg: pb.RegisterResponse
) -> None:
    keys = make_keys(4, seed=212)
    chunks = [payload(i, seed=212) for i in range(4)]
    assert shm_store(stub, reg, keys[:2], chunks[:2]) == 2
    reply = stub.StreamStore(
        stream_store_messages(reg.handle, keys[2:], chunks[2:], 5000, start_depth=2, chain=keys[2:]),
        timeout=RPC_TIMEOUT_S,
    )
    assert reply.stored == 2
    assert shm_load(stub, reg, keys) == chunks


CASES = ("other-key", "too-few", "too-many", "duplicate", "order", "late-keys", "malformed", "overrun")


def bad_stream(handle: bytes, case: str, seed: int) -> tuple[list[bytes], list[pb.StreamStoreMessage], str]:
    """The keys a case touches, its messages, and a fragment of the status it must get."""
    keys = make_keys(3, seed=seed)
    chunks = [payload(i, seed=seed) for i in range(3)]
    if case == "other-key":  # the second chunk's pieces carry a key the chain does not have there
        msgs = list(
            stream_store_messages(
                handle, [keys[0], make_keys(1, seed=seed + 50)[0], keys[2]], chunks, 5000, chain=keys
            )
        )
        return keys, msgs, "key: message "
    if case == "too-few":  # three keys named, two chunks sent
        return (
            keys,
            list(stream_store_messages(handle, keys[:2], chunks[:2], 5000, chain=keys)),
            "keys: the first message names 3",
        )
    if case == "too-many":  # two keys named, three chunks sent
        return (
            keys,
            list(stream_store_messages(handle, keys, chunks, 5000, chain=keys[:2])),
            "keys: the first message names 2",
        )
    if case == "duplicate":
        chain = [keys[0], keys[1], keys[0]]
        return (
            keys,
            list(stream_store_messages(handle, chain, chunks, 5000, chain=chain)),
            "keys: a key appears twice",
        )
    if case == "order":  # chunk 1 sent before chunk 0
        msgs = list(stream_store_messages(handle, keys[:2], chunks[:2], CB, chain=keys[:2]))
        first, second = msgs
        first.index, second.index = 1, 0
        first.key, second.key = keys[1], keys[0]
        return keys, msgs, "index: 1 (message 0)"
    if case == "late-keys":  # a later message names keys too
        msgs = list(stream_store_messages(handle, keys, chunks, CB, chain=keys))
        msgs[1].keys.extend(keys)
        return keys, msgs, "keys: only the stream's first message"
    if case == "malformed":
        chain = [keys[0], b"short", keys[2]]
        return (
            keys,
            list(stream_store_messages(handle, keys, chunks, 5000, chain=chain)),
            "keys[1]: must be 32 bytes, got 5",
        )
    assert case == "overrun"  # a chunk's pieces overrun it after the chain was reserved
    msgs = list(stream_store_messages(handle, keys, chunks, CB, chain=keys))
    msgs[2].data = chunks[2] + b"xx"
    return keys, msgs, "data: chunk index 2 overruns"


@pytest.mark.parametrize("case", CASES)
def test_keys_that_do_not_match_the_pieces_are_refused_and_nothing_is_visible(
    stub: Stub, reg: pb.RegisterResponse, case: str
) -> None:
    seed = 300 + 10 * CASES.index(case)
    before = make_keys(2, seed=seed + 5)
    before_chunks = [payload(i, seed=seed + 5) for i in range(2)]
    assert shm_store(stub, reg, before, before_chunks) == 2
    keys, messages, fragment = bad_stream(reg.handle, case, seed)
    with pytest.raises(grpc.RpcError) as info:
        stub.StreamStore(iter(messages), timeout=RPC_TIMEOUT_S)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert fragment in (info.value.details() or ""), info.value.details()
    assert all(cached(stub, reg, [key]) == 0 for key in keys)  # not even a chunk sent in full
    assert stub.Stats(pb.StatsRequest(), timeout=RPC_TIMEOUT_S).active_leases == 0
    assert shm_load(stub, reg, before) == before_chunks
    # Nothing stayed reserved: the same chunks store now, keys and all.
    chunks = [payload(i, seed=seed) for i in range(3)]
    assert (
        stub.StreamStore(
            stream_store_messages(reg.handle, keys, chunks, CB, chain=keys), timeout=RPC_TIMEOUT_S
        ).stored
        == 3
    )
    assert shm_load(stub, reg, keys) == chunks
