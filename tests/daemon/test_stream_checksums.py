"""A StreamStore's chunks are checksummed as the daemon writes them, not read again at commit (issue 30).

:class:`~tiercache.daemon.streams.ChunkAssembler` hashes each block of a piece where it lands in the slot;
the commit takes those checksums. So the checksum vouches for the bytes the stream carried: a byte that
changes in the slot between the write and the commit (a stray writer of the shared memory) makes the chunk
a miss when it is copied out, where a checksum taken at commit would have certified the changed bytes. Run
in process over a real L2 (shared memory) and the real cache manager.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from tiercache.cache import CacheConfig, CacheManager
from tiercache.daemon.streams import ChunkAssembler
from tiercache.keys import Namespace, chunk_keys
from tiercache.proto import tiercache_pb2 as pb
from tiercache.tiers.host import HostTier, HostTierConfig
from tiercache.tiers.values import checksum
from tiercache.wire.framing import Framed

PIECE = 700  # several pieces per chunk, none aligned to anything


@pytest.fixture
def cache(namespace: Namespace) -> Iterator[tuple[CacheManager, HostTier, bytes]]:
    nbytes = namespace.layout.chunk_bytes
    l2 = HostTier(
        HostTierConfig(
            capacity_bytes=4 * nbytes, slot_bytes=nbytes, segment_prefix="tiercache-test-streamsum"
        )
    )
    manager = CacheManager([l2], CacheConfig())
    yield manager, l2, manager.register_namespace(namespace)
    manager.close()


Streamed = tuple[int, dict[int, int], dict[int, torch.Tensor]]


def _stream(manager: CacheManager, ns_id: bytes, keys: list[bytes], chunks: list[bytes]) -> Streamed:
    """Reserve a ticket and write every chunk's pieces through an assembler: the ticket, its checksums
    and the slot buffers (in L2's shared memory) by chunk index."""
    ticket = manager.begin_store(ns_id, keys, ttl_s=30.0)
    buffers = {slot.index: slot.buffer for slot in ticket.slots}
    assembler = ChunkAssembler(len(chunks[0]), keys)
    for i, (key, chunk) in enumerate(zip(keys, chunks, strict=True)):
        for off in range(0, len(chunk), PIECE):
            header = pb.StreamStoreMessage(
                key=key,
                index=i,
                offset=off,
                codec=pb.CODEC_RAW,
                last=off + PIECE >= len(chunk),
                chunk_bytes=len(chunk),
            )
            piece = assembler.check(Framed(header, chunk[off : off + PIECE]))
            if piece.starts_chunk:
                assembler.open(piece, buffers[i])
            assembler.write(piece)
    assembler.finish()
    return ticket.ticket_id, assembler.checksums, buffers


def _chunks(namespace: Namespace, n: int) -> list[bytes]:
    gen = torch.Generator().manual_seed(n)
    nbytes = namespace.layout.chunk_bytes
    return [
        bytes(torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen).numpy()) for _ in range(n)
    ]


def test_the_assembler_checksums_what_it_wrote(
    cache: tuple[CacheManager, HostTier, bytes], namespace: Namespace
) -> None:
    manager, _, ns_id = cache
    keys = chunk_keys(namespace, list(range(2 * namespace.layout.chunk_tokens)))
    chunks = _chunks(namespace, 2)
    ticket, sums, _ = _stream(manager, ns_id, keys, chunks)
    assert sums == {i: checksum(c) for i, c in enumerate(chunks)}
    assert manager.commit_store(ticket, None, sums) == 2
    got = manager.get(ns_id, keys)
    assert [bytes(g.numpy()) if g is not None else None for g in got] == chunks


@pytest.mark.parametrize("at", [0, PIECE - 1, PIECE, -1])
def test_a_byte_changed_in_the_slot_before_commit_is_a_miss(
    cache: tuple[CacheManager, HostTier, bytes], namespace: Namespace, at: int
) -> None:
    manager, l2, ns_id = cache
    keys = chunk_keys(namespace, list(range(100, 100 + 2 * namespace.layout.chunk_tokens)))
    chunks = _chunks(namespace, 2)
    ticket, sums, buffers = _stream(manager, ns_id, keys, chunks)
    buffers[1][at] ^= 0xFF  # a stray writer, after the stream wrote the chunk and before the commit
    assert manager.commit_store(ticket, None, sums) == 2
    got = manager.get(ns_id, keys)
    assert got[0] is not None and bytes(got[0].numpy()) == chunks[0]
    assert got[1] is None  # never the changed bytes
    assert l2.usage().corrupt_reads == 1
