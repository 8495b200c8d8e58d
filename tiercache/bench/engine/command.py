"""``tiercache-bench engine``: time to first token of a real model with and without tiercache.

The measurement (and what each variant and ratio means) is :mod:`.run`'s, the table and JSON document
:mod:`.report`'s. Also runs standalone: ``python -m tiercache.bench.engine``.

Primitives:
    configure_parser: add the subcommand's flags to a parser.
    run: run the benchmark from parsed flags; returns the exit status.
    main: the standalone entry point.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from tiercache.errors import TierCacheError

from ..args import non_negative_ints
from .report import engine_to_dict, format_table
from .run import EngineBench


def _fractions(text: str) -> tuple[int, ...]:
    values = non_negative_ints(text)
    if any(v > 100 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: hit fractions are percentages in [0, 100]")
    return values


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Add the ``engine`` subcommand's flags to ``parser``."""
    parser.description = (__doc__ or "").split("\n\n")[0]
    parser.add_argument(
        "--prompt-lengths",
        type=non_negative_ints,
        default=(512, 1024, 2048, 4096, 8192),
        help="tokens (512,...,8192)",
    )
    parser.add_argument(
        "--hit-fractions",
        type=_fractions,
        default=(0, 50, 88, 100),
        help="cached %% of the prompt (0,50,88,100)",
    )
    parser.add_argument("--repeats", type=_positive, default=5, help="timed runs per figure, median kept (5)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per row (1)")
    parser.add_argument("--chunk-tokens", type=_positive, default=64, help="tokens per chunk (64)")
    parser.add_argument("--hidden", type=_positive, default=512, help="model hidden size (512)")
    parser.add_argument("--layers", type=_positive, default=6, help="model layers (6)")
    parser.add_argument("--bf16", action="store_true", help="bfloat16 weights and KV (default float32)")
    parser.add_argument("--seed", type=int, default=0, help="weights and prompts seed (0)")
    parser.add_argument("--address", default=None, help="use this daemon (default: start one in a temp dir)")
    parser.add_argument("--l2-bytes", default="1G", help="L2 size of a started daemon (1G)")
    parser.add_argument("--force-remote", action="store_true", help="byte stream instead of shared memory")
    parser.add_argument(
        "--grpc-only", action="store_true", help="unary calls through gRPC, not the daemon's control socket"
    )
    parser.add_argument("--threads", type=_positive, default=None, help="torch intra-op threads")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write every figure as JSON")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")


@contextlib.contextmanager
def _daemon(args: argparse.Namespace, chunk_bytes: int) -> Iterator[str]:
    """The daemon's address: ``--address``, or a daemon started in a temporary directory for the run."""
    if args.address:
        yield args.address
        return
    from tiercache.connector.local_daemon import LocalDaemon

    with tempfile.TemporaryDirectory(prefix="tiercache-bench-engine-") as tmp:
        daemon_args = ["--l2-bytes", args.l2_bytes, "--slot-bytes", str(chunk_bytes), "--l1-device", "none"]
        daemon_args += ["--l3-path", str(Path(tmp) / "l3"), "--l3-bytes", "4G", "--log-level", "WARNING"]
        daemon_args += ["--l2-prefix", f"tiercache-bench-{uuid.uuid4().hex[:8]}"]
        daemon = LocalDaemon.start(str(Path(tmp) / "d.sock"), daemon_args, Path(tmp) / "daemon.log")
        try:
            yield daemon.address
        finally:
            daemon.stop()


def run(args: argparse.Namespace) -> int:
    """Run the engine benchmark; 0 on success (missed targets are reported), 1 on failure."""
    try:
        from tiercache.connector.hf_model import kv_layout, reference_config
    except ImportError as exc:
        print(
            f"tiercache-bench engine: needs transformers (pip install 'tiercache[hf]'): {exc}",
            file=sys.stderr,
        )
        return 1
    old_threads = torch.get_num_threads()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        return _run(args, kv_layout, reference_config)
    except (TierCacheError, OSError) as exc:
        print(f"tiercache-bench engine: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        torch.set_num_threads(old_threads)


def _run(args: argparse.Namespace, kv_layout: Any, reference_config: Any) -> int:
    def progress(label: str) -> None:
        if not args.quiet:
            print(f"tiercache-bench engine: {label}", file=sys.stderr, flush=True)

    cfg = reference_config(
        hidden_size=args.hidden, intermediate_size=2 * args.hidden, num_hidden_layers=args.layers
    )
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    chunk_bytes = 2 * args.layers * args.chunk_tokens * kv_heads * (args.hidden // heads) * dtype.itemsize
    with _daemon(args, chunk_bytes) as address:
        bench = EngineBench(args, address)
        try:
            layout = kv_layout(bench.model, args.chunk_tokens)
            rows = list(bench.rows(progress))
        finally:
            bench.close()
    header = (
        f"engine TTFT: llama-ref {layout.num_layers} layers, hidden {args.hidden}, {heads} heads / "
        f"{layout.num_kv_heads} KV heads x {layout.head_dim}, {layout.dtype.value}; chunks of "
        f"{layout.chunk_tokens} tokens; {'byte stream' if args.force_remote else 'shared memory'}; "
        f"calls via {'gRPC' if args.grpc_only or args.force_remote else 'the control socket'}; "
        f"median of {args.repeats}; {torch.get_num_threads()} threads"
    )
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "handler"}
    if args.json is not None:
        args.json.write_text(json.dumps(engine_to_dict(rows, config), indent=2) + "\n")
    print(format_table(rows, header))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run standalone (``python -m tiercache.bench.engine``)."""
    parser = argparse.ArgumentParser(prog="tiercache-bench engine")
    configure_parser(parser)
    return run(parser.parse_args(argv))
