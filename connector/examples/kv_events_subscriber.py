"""What a prefix-aware router receives from a vLLM engine with tiercache: a KV-events subscriber.

Run vLLM with tiercache and its KV events on (``--kv-events-config '{"enable_kv_cache_events": true,
"publisher": "zmq", "endpoint": "tcp://*:5557"}'``), then::

    python connector/examples/kv_events_subscriber.py tcp://HOST:5557 [--all] [--count N] [--timeout S]

Each ZMQ message is ``[topic, 8-byte big-endian sequence number, msgpack payload]``; the payload decodes with
vLLM's own ``KVEventBatch``. Printed, one line per event: tiercache's (``ownership="tiercache"``: its L2 as
``medium=CPU``, L3 as ``STORAGE``, the shared tier as ``STORAGE`` with ``locality=REMOTE``), and with
``--all`` vLLM's own GPU events too. It stops after ``--count`` printed events (0: never) or ``--timeout``
seconds without one (exit status 1 when nothing was printed).
"""

from __future__ import annotations

import argparse
import sys

import msgspec
import zmq
from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVEventBatch


def describe(topic: bytes, seq: int, event: object) -> str:
    """One line for an event."""
    where = f"medium={getattr(event, 'medium', None)} locality={getattr(event, 'locality', None)}"
    who = f"ownership={getattr(event, 'ownership', None)}"
    head = f"{topic.decode(errors='replace')} #{seq} {type(event).__name__}"
    if isinstance(event, BlockStored):
        return (
            f"{head} {where} {who} blocks={event.block_hashes} parent={event.parent_block_hash} "
            f"tokens={len(event.token_ids)} block_size={event.block_size}"
        )
    if isinstance(event, BlockRemoved):
        return f"{head} {where} {who} blocks={event.block_hashes}"
    return head


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("endpoint", help="the engine's publisher, e.g. tcp://127.0.0.1:5557")
    parser.add_argument("--all", action="store_true", help="print vLLM's own events too")
    parser.add_argument("--count", type=int, default=0, help="stop after this many printed events (0: never)")
    parser.add_argument("--timeout", type=float, default=0, help="stop after this many seconds without one")
    args = parser.parse_args()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    if args.timeout > 0:
        sock.setsockopt(zmq.RCVTIMEO, int(args.timeout * 1000))
    sock.connect(args.endpoint)
    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
    printed = 0
    try:
        while not args.count or printed < args.count:
            try:
                topic, seq, payload = sock.recv_multipart()
            except zmq.Again:
                break
            for event in decoder.decode(payload).events:
                if args.all or getattr(event, "ownership", None) == "tiercache":
                    print(describe(topic, int.from_bytes(seq, "big", signed=True), event), flush=True)
                    printed += 1
    finally:
        sock.close(linger=0)
        ctx.term()
    return 0 if printed else 1


if __name__ == "__main__":
    sys.exit(main())
