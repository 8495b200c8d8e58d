"""KVCacheService handlers of the byte-stream data plane: StreamStore and StreamLoad.

For engines that cannot map the daemon's shared memory (another host, another container): chunks travel as
pieces of at most the negotiated message size, optionally zstd per piece (:mod:`.streams` cuts and checks
them). Pieces travel framed (their data never copied by protobuf, see :data:`~.streams.STREAM_CODECS`).
A chunk's first store piece is written in the executor call that reserves the chunk, later large pieces in
the executor (each while the next message arrives), small ones on the event loop, and the stream commits in
one executor call; a raw load piece is
a view of the leased slot that gRPC copies once when it writes the message, and only zstd load pieces of
more than ``INLINE_BYTES`` go to the executor. A StreamStore names its
handle in its first message; the handle is checked there (the same check the decorators of :mod:`.rpc` make),
and every later message must name the same handle or none.

Primitives:
    StreamRpcs: the handlers (a part of :class:`~tiercache.daemon.servicer.KVCacheServicer`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, ClassVar, ParamSpec

import zstandard

from tiercache.cache import StoreTicket
from tiercache.codec import Codec
from tiercache.errors import InvalidArgumentError
from tiercache.proto import tiercache_pb2 as pb
from tiercache.wire import CODECS
from tiercache.wire.framing import Framed

from . import convert
from .decode import WireCodec
from .rpc import Caller, ServicerBase, server_stream, unary_tenant
from .streams import INLINE_BYTES, LOAD_ZSTD_LEVEL, STREAM_CODECS, ChunkAssembler, Piece, encode_piece

P = ParamSpec("P")


class StreamRpcs(ServicerBase):
    """Stores and loads as streams of byte pieces."""

    WIRE_CODECS: ClassVar[Mapping[str, WireCodec]] = STREAM_CODECS

    @unary_tenant
    async def StreamStore(
        self, request_iterator: AsyncIterator[Framed[pb.StreamStoreMessage]], tenant: str, context: Any
    ) -> pb.StreamStoreResponse:
        """Store chunks sent as pieces; all are committed when the client closes the stream.

        A piece's write runs in the executor while the next message is received (the write is waited for
        before that message is checked: the checks follow the writes' progress).
        """
        handle = b""
        start_depth = 0
        assembler: ChunkAssembler | None = None
        tickets: list[StoreTicket] = []
        skipped: list[int] = []
        chunk_bytes = 0
        writing: asyncio.Future[None] | None = None
        try:
            async for msg in request_iterator:
                if writing is not None:
                    await writing
                    writing = None
                header = msg.header
                if assembler is None:
                    caller = self.resolve(tenant, header.handle)
                    handle, chunk_bytes = caller.namespace_id, caller.info.chunk_bytes
                    assembler = ChunkAssembler(chunk_bytes)
                    start_depth = header.start_depth
                elif header.handle and header.handle != handle:
                    raise InvalidArgumentError("handle", "differs from the stream's first message")
                piece = assembler.check(msg)
                if piece.starts_chunk:  # reserve and write in one executor call
                    depth = start_depth + piece.index
                    writing = self._submit(
                        self._start_chunk, assembler, handle, piece, depth, tickets, skipped
                    )
                elif memoryview(piece.data).nbytes > INLINE_BYTES:
                    writing = self._submit(assembler.write, piece)
                else:
                    assembler.write(piece)
            if writing is not None:
                await writing
                writing = None
            if assembler is None:
                return pb.StreamStoreResponse()
            assembler.finish()
            stored = await self.run(self._commit_all, tickets)
        finally:
            if writing is not None:  # failed or cancelled meanwhile: its ticket must be listed first
                await asyncio.wait([writing])
                if not writing.cancelled():
                    writing.exception()  # retrieved: the stream's own failure is the one reported
            for ticket in tickets:
                self.fire(self._manager.abort_store, ticket.ticket_id)
        self._deps.metrics.add_bytes("stream", "store", stored * chunk_bytes)
        return pb.StreamStoreResponse(stored=stored, skipped=skipped)

    def _submit(self, fn: Callable[P, None], *args: P.args, **kwargs: P.kwargs) -> asyncio.Future[None]:
        """Start a blocking call in the executor; the caller awaits it later."""
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self._deps.executor, functools.partial(fn, *args, **kwargs))

    def _start_chunk(
        self,
        assembler: ChunkAssembler,
        handle: bytes,
        piece: Piece,
        depth: int,
        tickets: list[StoreTicket],
        skipped: list[int],
    ) -> None:
        """Reserve the chunk of a first piece (its ticket joins ``tickets`` at once, to be aborted if the
        stream fails) and write the piece into it. Blocking: runs in the executor."""
        ticket = self._rules.begin_stream_store(handle, piece.key, depth)
        tickets.append(ticket)
        if not ticket.slots:
            skipped.append(piece.index)
        assembler.open(piece, ticket.slots[0].buffer if ticket.slots else None)
        assembler.write(piece)

    def _commit_all(self, tickets: list[StoreTicket]) -> int:
        """Commit the tickets in order, each leaving ``tickets`` once committed (what is left when one
        fails is aborted by the caller). Blocking: runs in the executor, one call for the whole stream."""
        stored = 0
        while tickets:
            stored += self._manager.commit_store(tickets[0].ticket_id)
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
        cctx = zstandard.ZstdCompressor(level=LOAD_ZSTD_LEVEL) if zstd else None
        ticket = await self.run(self._rules.lease, caller.namespace_id, keys)
        done = ticket.lease_id == 0
        try:
            for chunk in ticket.chunks:
                for start in range(0, chunk_bytes, piece_bytes):
                    stop = min(start + piece_bytes, chunk_bytes)
                    if cctx is not None and stop - start > INLINE_BYTES:
                        data, packed = await self.run(encode_piece, chunk.view, start, stop, cctx)
                    else:
                        data, packed = encode_piece(chunk.view, start, stop, cctx)
                    header = pb.StreamLoadMessage(
                        index=chunk.index,
                        key=chunk.key,
                        offset=start,
                        codec=CODECS.to_proto(Codec.ZSTD if packed else Codec.RAW),
                        last=stop == chunk_bytes,
                        chunk_bytes=chunk_bytes,
                    )
                    yield Framed(header, data)
                self._deps.metrics.add_bytes("stream", "load", chunk_bytes)
            await self.run(self._manager.release, ticket.lease_id)
            done = True
        finally:
            if not done:  # cancelled or failed: release without waiting (this coroutine may not resume)
                self.fire(self._manager.release, ticket.lease_id)
