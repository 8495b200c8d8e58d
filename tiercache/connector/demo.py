"""``tiercache-model-demo`` (or ``python -m tiercache.connector.demo``): a real model reusing KV through the daemon.

It uses the daemon on the default socket, or starts one (modest sizes) and stops it at exit; builds the
reference Llama-style model from a fixed seed (no download; token ids are synthetic), attaches
:class:`~tiercache.connector.hf.HFAdapter`, and runs two workloads:

* shared system prompt: several requests made of one long system prompt and a different question each;
* multi-turn chat: each turn's prompt is the whole conversation so far plus a new user message.

Every request also runs with the cache off. The table shows, per request, the prompt tokens, the tokens
whose KV came from the cache (and the tier), TTFT with and without the cache, and whether the greedy tokens
were identical. By default the demo first purges its model's namespace so that the run starts cold.

Primitives:
    main: the console entry point.
    build_parser: its argparse parser.
    Row, run_workloads, format_table: the workload and its table.
    Progress: a plain progress bar on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import torch

from tiercache.errors import TierCacheError

from .client import TierCacheClient
from .config import ConnectorConfig, DataPlaneMode
from .connection import ClientConfig
from .hf import HFAdapter, RequestReport
from .hf_model import build_reference_model, kv_layout
from .local_daemon import default_socket, ensure_daemon

logger = logging.getLogger(__name__)


class Progress:
    """A one-line progress bar (``[#####.....] 3/10 label``) redrawn in place on a stream."""

    def __init__(
        self, total: int, stream: TextIO | None = None, width: int = 30, enabled: bool = True
    ) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.enabled = enabled

    def step(self, label: str) -> None:
        """Count one unit of work done and redraw."""
        self.done += 1
        if not self.enabled:
            return
        filled = self.width * self.done // self.total
        bar = "#" * filled + "." * (self.width - filled)
        self.stream.write(f"\r[{bar}] {self.done}/{self.total} {label:<24}")
        if self.done >= self.total:
            self.stream.write("\n")
        self.stream.flush()


@dataclass(frozen=True, slots=True)
class Row:
    """One request of the demo: with the cache and with it off.

    Attributes:
        name: workload and request number.
        cached: the report of the run through tiercache.
        off: the report of the same request with the cache off.
        same_tokens: both runs generated the same greedy tokens.
    """

    name: str
    cached: RequestReport
    off: RequestReport
    same_tokens: bool


@dataclass(frozen=True, slots=True)
class Workload:
    """Sizes of the demo's workload (tokens)."""

    system_tokens: int = 1024
    requests: int = 4
    question_tokens: int = 64
    turns: int = 3
    new_tokens: int = 16
    seed: int = 0


def _tokens(seed: int, n: int, vocab: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return [int(t) for t in torch.randint(0, vocab, (n,), generator=gen)]


def _requests(w: Workload, vocab: int) -> Iterator[tuple[str, list[int]]]:
    """The shared-system-prompt requests (the chat's turns depend on its replies: see run_workloads)."""
    system = _tokens(w.seed * 1000 + 1, w.system_tokens, vocab)
    for i in range(w.requests):
        length = max(1, w.question_tokens * (3 + i % 3) // 4)
        yield f"shared {i + 1}", system + _tokens(w.seed * 1000 + 100 + i, length, vocab)


def run_workloads(cached: HFAdapter, off: HFAdapter, w: Workload, progress: Progress) -> list[Row]:
    """Run the shared-prompt requests, then the chat turns, each with the cache and with it off."""
    vocab = int(cached.model.config.vocab_size)
    off.generate(_tokens(w.seed, 16, vocab), 2)  # warm-up (first-call allocations), not reported
    rows: list[Row] = []

    def run(name: str, tokens: list[int]) -> tuple[int, ...]:
        base = off.generate(tokens, w.new_tokens)
        progress.step(f"{name} (cache off)")
        got = cached.generate(tokens, w.new_tokens)
        progress.step(f"{name} (tiercache)")
        rows.append(Row(name, got.report, base.report, got.tokens == base.tokens))
        return got.tokens

    for name, tokens in _requests(w, vocab):
        run(name, tokens)
    history = _tokens(w.seed * 1000 + 2, w.system_tokens // 2, vocab)
    for turn in range(w.turns):
        history += _tokens(w.seed * 1000 + 200 + turn, w.question_tokens, vocab)
        reply = run(f"chat turn {turn + 1}", history)
        history += list(reply)
    return rows


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def format_table(rows: Sequence[Row]) -> str:
    """The per-request table and a summary line."""
    head = ("#", "request", "prompt", "cached", "tier", "TTFT cache ms", "TTFT off ms", "speedup", "same")
    body = [
        (
            str(i + 1),
            r.name,
            str(r.cached.prompt_tokens),
            str(r.cached.tokens_reused),
            r.cached.source,
            _ms(r.cached.ttft_s),
            _ms(r.off.ttft_s),
            f"{r.off.ttft_s / r.cached.ttft_s:.2f}x" if r.cached.ttft_s > 0 else "-",
            "yes" if r.same_tokens else "NO",
        )
        for i, r in enumerate(rows)
    ]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    left = {1, 4}

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))
        )

    prompt = sum(r.cached.prompt_tokens for r in rows)
    reused = sum(r.cached.tokens_reused for r in rows)
    with_cache = sum(r.cached.ttft_s for r in rows)
    without = sum(r.off.ttft_s for r in rows)
    summary = (
        f"cached {reused} of {prompt} prompt tokens ({100 * reused / max(prompt, 1):.0f}%); "
        f"TTFT total {_ms(with_cache)} ms with tiercache vs {_ms(without)} ms with the cache off"
        f" ({without / with_cache if with_cache > 0 else 0:.2f}x)"
    )
    rule = "-" * len(line(head))
    return "\n".join([line(head), rule, *(line(b) for b in body), rule, summary])


def build_parser() -> argparse.ArgumentParser:
    """The demo's command line."""
    p = argparse.ArgumentParser(
        prog="tiercache-model-demo",
        description="A Llama-style model (random weights from a seed, no download) reusing prompt KV through "
        "the tiercache daemon: shared system prompt and multi-turn chat, TTFT with and without the cache.",
    )
    d = p.add_argument_group("daemon (used when one answers on --socket, else started and stopped at exit)")
    d.add_argument("--socket", default=None, help="daemon socket (default: the daemon's default socket)")
    d.add_argument("--l2-bytes", default="256M", help="L2 size of a started daemon (256M)")
    d.add_argument("--l3-bytes", default="1G", help="L3 size of a started daemon (1G)")
    d.add_argument("--l3-path", default=None, help="L3 directory of a started daemon (the daemon's default)")
    d.add_argument("--daemon-log", type=Path, default=None, help="log file of a started daemon (a temp file)")
    m = p.add_argument_group("model and workload")
    m.add_argument("--hidden", type=int, default=512, help="hidden size (512); 8 heads, 2 KV heads")
    m.add_argument("--layers", type=int, default=6, help="decoder layers (6)")
    m.add_argument("--bf16", action="store_true", help="bfloat16 weights and KV (default float32)")
    m.add_argument("--chunk-tokens", type=int, default=64, help="tokens per cached chunk (64)")
    m.add_argument("--system-tokens", type=int, default=1024, help="shared system prompt length (1024)")
    m.add_argument("--requests", type=int, default=4, help="requests sharing the system prompt (4)")
    m.add_argument("--question-tokens", type=int, default=64, help="user message length (64)")
    m.add_argument("--turns", type=int, default=3, help="chat turns (3)")
    m.add_argument("--new-tokens", type=int, default=16, help="tokens generated per request (16)")
    m.add_argument("--seed", type=int, default=0, help="seed of the weights and the prompts (0)")
    m.add_argument("--force-remote", action="store_true", help="byte stream instead of shared memory")
    m.add_argument("--keep", action="store_true", help="do not purge the model's cached chunks first")
    m.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def _daemon_args(args: argparse.Namespace, slot_bytes: int) -> list[str]:
    out = ["--l2-bytes", args.l2_bytes, "--l3-bytes", args.l3_bytes, "--slot-bytes", str(slot_bytes)]
    out += ["--l1-bytes", "256M"]  # its log goes to --daemon-log or a temp file
    if args.l3_path is not None:
        out += ["--l3-path", args.l3_path]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; returns 0, or 1 when the daemon could not be reached or started."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    model = build_reference_model(
        args.seed,
        torch.bfloat16 if args.bf16 else torch.float32,
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers,
    )
    socket = args.socket or default_socket()
    chunk_bytes = kv_layout(model, args.chunk_tokens).chunk_bytes
    w = Workload(
        args.system_tokens, args.requests, args.question_tokens, args.turns, args.new_tokens, args.seed
    )
    try:
        stack = contextlib.ExitStack()
        with stack:
            started = stack.enter_context(
                ensure_daemon(socket, _daemon_args(args, chunk_bytes), args.daemon_log)
            )
            where = f"started a daemon on {socket} (stopped at exit)" if started else f"daemon on {socket}"
            client = stack.enter_context(
                TierCacheClient.connect(f"unix:{socket}", config=ClientConfig(timeout_s=10.0))
            )
            config = ConnectorConfig(DataPlaneMode.STREAM if args.force_remote else DataPlaneMode.AUTO)
            cached = HFAdapter.attach(model, client, args.chunk_tokens, f"seed{args.seed}", config=config)
            assert cached.connector is not None
            if not args.keep:
                client.purge(cached.connector.namespace)
            layout = cached.connector.namespace.layout
            print(
                f"tiercache model demo: {where}; model llama-ref {layout.num_layers} layers, "
                f"{layout.num_kv_heads} KV heads x {layout.head_dim}, {layout.dtype.value}; "
                f"chunks of {layout.chunk_tokens} tokens ({chunk_bytes // 1024} KiB); "
                f"{'byte stream' if args.force_remote else 'shared memory'}"
            )
            total = 2 * (w.requests + w.turns)
            progress = Progress(total, enabled=not args.no_progress)
            rows = run_workloads(cached, HFAdapter(model, None), w, progress)
    except TierCacheError as exc:
        print(f"tiercache-model-demo: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
