"""``tiercache-bench workload``: synthetic or JSONL traces replayed through the cache; token-weighted
lookup hit, load success and effective hit per tier, bytes moved, evictions and prefill saved.

Primitives:
    configure_parser: the subcommand's flags.
    run: run it from parsed arguments; the exit status.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tiercache.policies.load import LoadPolicyKind
from tiercache.testing.embedded import EmbeddedDaemonConfig

from ..args import (
    add_address_flags,
    add_output_flags,
    add_policy_flags,
    enum_choice,
    non_negative_float,
    parse_device,
    parse_sizes,
    positive_float,
    positive_int,
    size_or_zero,
)
from ..command import FAILURES, failure_status, finish, progress_to_stderr, torch_threads
from ..common.layout_cases import LayoutCase, parse_layouts
from .replay import ReplayOptions
from .report import format_workload_report, workload_charts, workload_to_dict
from .run import TraceInput, WorkloadConfig, run_workload
from .traces import TraceKind, TraceSpec, generate_trace, read_jsonl


def _kinds(text: str) -> tuple[TraceKind, ...]:
    parse = enum_choice(TraceKind)
    return tuple(dict.fromkeys(parse(p.strip()) for p in text.split(",") if p.strip()))


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Add the ``workload`` flags to ``p``."""
    t = p.add_argument_group("traces")
    t.add_argument(
        "--traces",
        type=_kinds,
        default=None,
        help="synthetic traces: system_prompt, chat, rag, unique, thrash (default: all, or none with "
        "--trace-file)",
    )
    t.add_argument(
        "--trace-file",
        type=Path,
        action="append",
        default=[],
        metavar="PATH.jsonl",
        help="replay a JSONL trace (repeatable; given alone, no synthetic trace runs unless --traces is "
        'given too). One request per line: {"tokens": [ids...]} or {"prefix": [{"id": "sys", "tokens": '
        '2048}, ...], "unique_tokens": 200}; see tiercache.bench.workload.traces',
    )
    t.add_argument("--requests", type=positive_int, default=200, help="requests per synthetic trace (200)")
    t.add_argument(
        "--system-tokens", type=positive_int, default=1024, help="shared system prompt tokens (1024)"
    )
    t.add_argument(
        "--query-tokens", type=positive_int, default=256, help="unique query / chat turn tokens (256)"
    )
    t.add_argument("--sessions", type=positive_int, default=8, help="chat sessions (8)")
    t.add_argument("--documents", type=positive_int, default=64, help="RAG documents (64)")
    t.add_argument("--doc-tokens", type=positive_int, default=1024, help="tokens per RAG document (1024)")
    t.add_argument("--docs-per-request", type=positive_int, default=2, help="RAG documents per prompt (2)")
    t.add_argument("--zipf-s", type=positive_float, default=1.1, help="Zipf exponent of RAG popularity (1.1)")
    t.add_argument(
        "--prompt-tokens", type=positive_int, default=2048, help="unique/thrash prompt tokens (2048)"
    )
    t.add_argument("--seed", type=int, default=0, help="trace seed (0)")
    c = p.add_argument_group("cache")
    c.add_argument(
        "--layout",
        type=parse_layouts,
        default=parse_layouts("tiny"),
        help="KV layout: 7b, 1b, tiny (4 layers x 2 kv heads x dim 64) or LAYERSxHEADSxDIM; bf16 (tiny)",
    )
    c.add_argument("--chunk-tokens", type=positive_int, default=256, help="tokens per chunk (256)")
    c.add_argument("--l1-bytes", type=size_or_zero, default=0, help="L1 capacity, 0 for none (0)")
    c.add_argument(
        "--l2-bytes",
        type=parse_sizes,
        default=parse_sizes("16M,64M,256M"),
        help="L2 capacities to sweep, comma-separated (16M,64M,256M)",
    )
    c.add_argument("--l3-bytes", type=size_or_zero, default=256 << 20, help="L3 capacity, 0 for none (256M)")
    c.add_argument("--device", type=parse_device, default="cpu", help="in-process L1 device (cpu)")
    add_policy_flags(c)
    c.add_argument(
        "--load-policy",
        type=enum_choice(LoadPolicyKind),
        default=LoadPolicyKind.WAIT_COMPLETE,
        help="wait_complete, best_effort, timeout or cost_aware (wait_complete; others need --inproc)",
    )
    c.add_argument("--timeout-s", type=non_negative_float, default=0.05, help="timeout policy's wait (0.05)")
    c.add_argument("--prefetch", action="store_true", help="start promotion of the cached prefix at lookup")
    c.add_argument(
        "--prefill-rate",
        type=positive_float,
        default=10_000.0,
        metavar="TOKENS_PER_S",
        help="the engine's prefill rate: prefill saved = effective hit / rate; cost_aware's model (10000)",
    )
    c.add_argument(
        "--no-verify", action="store_true", help="do not compare loaded bytes with the stored ones"
    )
    c.add_argument(
        "--threads",
        type=positive_int,
        default=1,
        help="torch intra-op threads (1: per-chunk copies are small, and more threads spin against the "
        "cache's own worker threads)",
    )
    w = p.add_argument_group(
        "where", "in-process (--inproc), a running daemon (--address) or a daemon per size"
    )
    w.add_argument("--inproc", action="store_true", help="replay through an in-process CacheManager")
    add_address_flags(w)
    w.add_argument("--daemon-l1-device", default="cpu", help="started daemons' L1 device when --l1-bytes > 0")
    add_output_flags(p, "plot lookup-hit and effective-hit rates vs L2 size per trace (PNG)")


def _traces(args: argparse.Namespace, working_set_tokens: int) -> tuple[TraceInput, ...]:
    spec = TraceSpec(
        requests=args.requests,
        system_tokens=args.system_tokens,
        query_tokens=args.query_tokens,
        answer_tokens=args.query_tokens,
        sessions=args.sessions,
        documents=args.documents,
        doc_tokens=args.doc_tokens,
        docs_per_request=args.docs_per_request,
        zipf_s=args.zipf_s,
        prompt_tokens=args.prompt_tokens,
        working_set_tokens=working_set_tokens,
        seed=args.seed,
    )
    kinds = args.traces if args.traces is not None else (() if args.trace_file else tuple(TraceKind))
    out = [TraceInput(k.value, tuple(generate_trace(k, spec))) for k in kinds]
    out += [TraceInput(path.name, tuple(read_jsonl(path, args.seed))) for path in args.trace_file]
    return tuple(out)


def _config(args: argparse.Namespace) -> WorkloadConfig:
    name, layers, heads, dim = args.layout[0]
    layout = LayoutCase(name, layers, heads, dim, args.chunk_tokens).layout()
    options = ReplayOptions(
        layout=layout,
        write_policy=args.write_policy,
        eviction_policy=args.eviction_policy,
        load_policy=args.load_policy,
        timeout_s=args.timeout_s,
        prefetch=args.prefetch,
        prefill_tokens_per_s=args.prefill_rate,
        l1_device=args.device,
        verify=not args.no_verify,
    )
    fast = args.l1_bytes + max(args.l2_bytes)
    working_set = 2 * fast // layout.chunk_bytes * layout.chunk_tokens
    return WorkloadConfig(
        traces=_traces(args, working_set),
        l1_bytes=args.l1_bytes,
        l2_sizes=args.l2_bytes,
        l3_bytes=args.l3_bytes,
        options=options,
        inproc=args.inproc,
        address=args.address,
        token=args.token,
        daemon=EmbeddedDaemonConfig(slot_bytes=layout.chunk_bytes, l1_device=args.daemon_l1_device,
                                    l2_bytes=max(args.l2_bytes)),
        work_root=args.dir,
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Run ``workload``; 0 on success, 1 when a load differed from the store or the cache failed."""
    try:
        config = _config(args)
    except FAILURES as exc:
        return failure_status(exc)
    with progress_to_stderr(not args.quiet), torch_threads(args.threads):
        try:
            report = run_workload(config, progress=not args.quiet)
        except FAILURES as exc:
            return failure_status(exc)
    return finish(args, workload_to_dict(report), format_workload_report(report), workload_charts(report))
