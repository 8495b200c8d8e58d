"""``tiercache-bench compare``: the same store/load workload against recompute (a seeded reference model),
a local Redis, plain files and tiercache, measured in one run in interleaved rounds (``--rounds``, the
peer order rotated each round, medians and their spread kept), with tiercache's ratio to each.

Primitives:
    configure_parser: the subcommand's flags.
    run: run it from parsed arguments; the exit status.
"""

from __future__ import annotations

import argparse

from tiercache.testing.embedded import EmbeddedDaemonConfig

from ..args import add_daemon_flags, add_output_flags, positive_int
from ..command import FAILURES, failure_status, finish, progress_to_stderr, torch_threads
from .refmodel import ModelSpec
from .report import compare_charts, compare_to_dict, format_compare_report
from .run import CompareConfig, run_compare


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Add the ``compare`` flags to ``p``."""
    m = p.add_argument_group("reference model (seeded, built from a config; nothing is downloaded)")
    m.add_argument("--layers", type=positive_int, default=6, help="decoder layers (6)")
    m.add_argument("--hidden", type=positive_int, default=512, help="hidden size (512)")
    m.add_argument("--heads", type=positive_int, default=8, help="attention heads (8)")
    m.add_argument("--kv-heads", type=positive_int, default=2, help="KV heads (2)")
    m.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="model/KV dtype")
    w = p.add_argument_group("workload")
    w.add_argument("--prompts", type=positive_int, default=8, help="timed prompts (8, plus one warm-up)")
    w.add_argument("--prompt-tokens", type=positive_int, default=2048, help="tokens per prompt (2048)")
    w.add_argument("--chunk-tokens", type=positive_int, default=256, help="tokens per chunk (256)")
    w.add_argument("--seed", type=int, default=0, help="model and prompt seed (0)")
    w.add_argument(
        "--rounds",
        type=positive_int,
        default=5,
        help="interleaved rounds, each a pass of every peer in an order rotated per round; times are the "
        "median round, shown with the lowest and highest (5; 1: one pass per peer)",
    )
    w.add_argument(
        "--threads", type=positive_int, default=None, help="torch intra-op threads (torch's default)"
    )
    q = p.add_argument_group("peers")
    q.add_argument("--redis-url", default=None, help="use this Redis (redis://host:port, unix:///path) "
                   "instead of starting redis-server")  # fmt: skip
    q.add_argument("--fsync", action="store_true", help="the files peer fsyncs every chunk file")
    q.add_argument("--no-stream", action="store_true", help="skip tiercache's byte stream")
    add_daemon_flags(p, l2_default="256M", l3_default="0")
    add_output_flags(p, "plot restore GB/s per peer (PNG)")


def _config(args: argparse.Namespace) -> CompareConfig:
    if args.hidden % args.heads or args.heads % args.kv_heads:
        raise ValueError("--hidden must be a multiple of --heads, and --heads of --kv-heads")
    model = ModelSpec(
        layers=args.layers,
        hidden=args.hidden,
        heads=args.heads,
        kv_heads=args.kv_heads,
        intermediate=2 * args.hidden,
        dtype=args.dtype,
        seed=args.seed,
    )
    daemon = EmbeddedDaemonConfig(
        l1_device=args.daemon_l1_device,
        l1_bytes=args.daemon_l1_bytes,
        l2_bytes=args.daemon_l2_bytes,
        l3_bytes=args.daemon_l3_bytes,
        write_policy=args.write_policy,
        eviction_policy=args.eviction_policy,
        slot_bytes=1,
    )
    return CompareConfig(
        model=model,
        chunk_tokens=args.chunk_tokens,
        prompts=args.prompts,
        prompt_tokens=args.prompt_tokens,
        rounds=args.rounds,
        fsync=args.fsync,
        redis_url=args.redis_url,
        stream=not args.no_stream,
        address=args.address,
        token=args.token,
        daemon=daemon,
        work_root=args.dir,
        seed=args.seed,
    )


def run(args: argparse.Namespace) -> int:
    """Run ``compare``; 0 on success, 1 when a peer loaded other bytes than were stored or failed."""
    try:
        config = _config(args)
    except FAILURES as exc:
        return failure_status(exc)
    with progress_to_stderr(not args.quiet), torch_threads(args.threads):
        try:
            report = run_compare(config, progress=not args.quiet)
        except FAILURES as exc:
            return failure_status(exc)
    return finish(args, compare_to_dict(report), format_compare_report(report), compare_charts(report))
