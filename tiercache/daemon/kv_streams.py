"""KVCacheService handlers of the byte-stream data plane: StreamStore and StreamLoad.

For engines that cannot map the daemon's shared memory (another host, another container): chunks travel as
pieces of at most the negotiated message size, optionally zstd per piece (:mod:`.streams` cuts and checks
them). Pieces travel framed (their data never copied by protobuf, see :data:`~.streams.STREAM_CODECS`).
A StreamStore whose first message names its key chain (field ``keys``) is reserved in one executor call
(one ticket, with the first piece's write); one that does not (an older client) reserves each chunk in the
executor call that writes its first piece. Later pieces are written on the event loop, large ones (see
``INLINE_COPY_BYTES``) in the executor while the next message arrives, and the stream commits in one
executor call; a raw
load piece is a view of the leased slot that gRPC copies once when it writes the message, and only zstd
load pieces of more than ``INLINE_BYTES`` go to the executor. A StreamStore names its handle in its first
message; the handle is checked there (the same check the decorators of :mod:`.rpc` make), and every later
message must name the same handle or none, and no keys.

Primitives:
    StreamRpcs: the handlers (a part of :class:`~tiercache.daemon.servicer.KVCacheServicer`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, ClassVar, ParamSpec

import torch

from tiercache.cache import StoreTicket
from tiercache.codec import Codec
from tiercache.errors import InvalidArgumentError
from tiercache.proto import tiercache_pb2 as pb
from tiercache.wire import CODECS
from tiercache.wire.framing import Framed
from tiercache.wire.pieces import PieceEncoder, piece_spans

from . import convert
from .decode import WireCodec
from .rpc import Caller, ServicerBase, server_stream, unary_tenant
from .streams import (
    INLINE_BYTES,
    INLINE_COPY_BYTES,
    STREAM_CODECS,
    ChunkAssembler,
    Piece,
    load_piece,
)

P = ParamSpec("P")


@dataclass(slots=True)
class _Reserved:
    """What a StreamStore reserved so far (mutable state of one stream).

    Attributes:
        tickets: its store tickets, in order (aborted unless committed).
        skipped: indices of chunks not reserved (cached already, or being stored by someone else).
        buffers: index -> the buffer reserved for that chunk.
        bases: ticket id -> the stream index of its chain position 0.
    """

    tickets: list[StoreTicket] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    buffers: dict[int, torch.Tensor] = field(default_factory=dict)
    bases: dict[int, int] = field(default_factory=dict)


async def _finished(future: Future[None]) -> None:
    """Wait for an executor call (without a round trip through the event loop when it is done already).

    Raises:
        Exception: the call's.
    """
    if not future.done():
        await asyncio.wrap_future(future)
    future.result()


class StreamRpcs(ServicerBase):
    """Stores and loads as streams of byte pieces."""

    WIRE_CODECS: ClassVar[Mapping[str, WireCodec]] = STREAM_CODECS

    @unary_tenant
    async def StreamStore(
        self, request_iterator: AsyncIterator[Framed[pb.StreamStoreMessage]], tenant: str, context: Any
    ) -> pb.StreamStoreResponse:
        """Store chunks sent as pieces; all are committed when the client closes the stream.

        A piece's write runs in the executor while the next message is received (the write is waited for
        before that message is checked: the checks follow the writes' progress). A stream whose first
        message names its keys is reserved in one call, with the first piece, and committed in one call.
        The stream counts among the tenant's open streams (:mod:`.fairness`).
        """
        with self._deps.holdings.hold(tenant, "streams"):
            return await self._stream_store(request_iterator, tenant)

    async def _stream_store(
        self, request_iterator: AsyncIterator[Framed[pb.StreamStoreMessage]], tenant: str
    ) -> pb.StreamStoreResponse:
        handle = b""
        start_depth = 0
        assembler: ChunkAssembler | None = None
        chain: list[bytes] | None = None
        reserved = _Reserved()
        chunk_bytes = 0
        writing: Future[None] | None = None
        try:
            async for msg in request_iterator:
                if writing is not None:
                    await _finished(writing)
                    writing = None
                header = msg.header
                if assembler is None:
                    caller = self.resolve(tenant, header.handle)
                    handle, chunk_bytes = caller.namespace_id, caller.info.chunk_bytes
                    chain = convert.keys_from_proto(header.keys) if header.keys else None
                    assembler = ChunkAssembler(chunk_bytes, chain)
                    start_depth = header.start_depth
                elif header.handle and header.handle != handle:
                    raise InvalidArgumentError("handle", "differs from the stream's first message")
                elif header.keys:
                    raise InvalidArgumentError("keys", "only the stream's first message may name keys")
                piece = assembler.check(msg)
                if piece.starts_chunk and (chain is None or piece.index == 0):
                    # reserve (the whole chain, or this chunk) and write in one executor call
                    keys, base = (chain, 0) if chain is not None else ([piece.key], piece.index)
                    writing = self._submit(
                        self._reserve, assembler, handle, keys, base, start_depth + base, piece, reserved
                    )
                    continue
                if piece.starts_chunk:
                    assembler.open(piece, reserved.buffers.get(piece.index))
                if memoryview(piece.data).nbytes > (INLINE_BYTES if piece.zstd else INLINE_COPY_BYTES):
                    writing = self._submit(assembler.write, piece)
                else:
                    assembler.write(piece)
            if writing is not None:
                await _finished(writing)
                writing = None
            if assembler is None:
                return pb.StreamStoreResponse()
            assembler.finish()
            stored = await self.run(self._commit_all, reserved, assembler.checksums)
        finally:
            if writing is not None:  # failed or cancelled meanwhile: its ticket must be listed first
                await asyncio.wait([asyncio.wrap_future(writing)])
                if not writing.cancelled():
                    writing.exception()  # retrieved: the stream's own failure is the one reported
            for ticket in reserved.tickets:
                self.fire(self._manager.abort_store, ticket.ticket_id)
        self._deps.metrics.add_bytes("stream", "store", stored * chunk_bytes)
        return pb.StreamStoreResponse(stored=stored, skipped=reserved.skipped)

    def _submit(self, fn: Callable[P, None], *args: P.args, **kwargs: P.kwargs) -> Future[None]:
        """Start a blocking call in the executor; the caller waits for it with :func:`_finished`.

        A plain executor future: one that is done by the time it is waited for (the usual case: a piece is
        written while the next message arrives) costs the event loop no wake-up from the worker thread.
        """
        return self._deps.executor.submit(fn, *args, **kwargs)

    def _reserve(
        self,
        assembler: ChunkAssembler,
        handle: bytes,
        keys: list[bytes],
        base: int,
        depth: int,
        piece: Piece,
        reserved: _Reserved,
    ) -> None:
        """Reserve ``keys``, the chunks of indices ``base``, ``base + 1``, ... at chain depth ``depth`` on
        (its ticket joins ``reserved`` at once, to be aborted if the stream fails), then open the chunk of
        ``piece`` and write the piece. Blocking: runs in the executor."""
        ticket = self._rules.begin_stream_store(handle, keys, depth)
        reserved.tickets.append(ticket)
        reserved.bases[ticket.ticket_id] = base
        reserved.skipped.extend(base + i for i in ticket.skipped)
        reserved.buffers.update((base + slot.index, slot.buffer) for slot in ticket.slots)
        assembler.open(piece, reserved.buffers.get(piece.index))
        assembler.write(piece)

    def _commit_all(self, reserved: _Reserved, checksums: dict[int, int]) -> int:
        """Commit the tickets in order, each leaving ``reserved.tickets`` once committed (what is left when
        one fails is aborted by the caller), with the checksums the assembler took as each chunk landed
        (stream index -> xxh3-64). Blocking: runs in the executor, one call for the whole stream."""
        stored = 0
        tickets = reserved.tickets
        while tickets:
            ticket = tickets[0]
            base = reserved.bases.get(ticket.ticket_id, 0)
            known = {s.index: checksums[base + s.index] for s in ticket.slots if base + s.index in checksums}
            stored += self._manager.commit_store(ticket.ticket_id, None, known)
            tickets.pop(0)
        return stored

    @server_stream
    async def StreamLoad(
        self, request: pb.StreamLoadRequest, caller: Caller, context: Any
    ) -> AsyncIterator[Framed[pb.StreamLoadMessage]]:
        """Stream the cached prefix as pieces of at most the negotiated message size."""
        chunk_bytes = caller.info.chunk_bytes
        keys = convert.keys_from_proto(request.keys)
        zstd = CODECS.from_proto(int(request.codec), "codec") is Codec.ZSTD
        piece_bytes = self._deps.stream.stream_chunk_bytes
        if request.max_message_bytes:
            piece_bytes = min(piece_bytes, request.max_message_bytes)
        encoder = PieceEncoder(Codec.ZSTD if zstd else Codec.RAW)
        ticket = await self.run(self._rules.lease, caller.namespace_id, keys)
        done = ticket.lease_id == 0
        sent = 0  # whole chunks written, counted in the metrics once (not a counter update per chunk)
        try:
            for chunk in ticket.chunks:
                for start, stop in piece_spans(chunk_bytes, piece_bytes):
                    piece = (chunk.key, chunk.index, chunk.view, start, stop, chunk_bytes, chunk.source)
                    if zstd and stop - start > INLINE_BYTES:
                        yield await self.run(load_piece, encoder, *piece)
                    else:
                        yield load_piece(encoder, *piece)
                sent += 1
            await self.run(self._manager.release, ticket.lease_id)
            done = True
        finally:
            self._deps.metrics.add_bytes("stream", "load", sent * chunk_bytes)
            if not done:  # cancelled or failed: release without waiting (this coroutine may not resume)
                self.fire(self._manager.release, ticket.lease_id)
