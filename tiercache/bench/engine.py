"""``tiercache-bench engine``: time to first token of a real model with and without tiercache.

On the reference Llama-style model (random weights from a seed, no download) and a daemon (the one at
``--address``, else one started in a temporary directory and stopped at the end), for each prompt length and
hit fraction it measures, interleaved and ``--repeats`` times (medians reported):

* recompute: the whole prompt prefilled, the cache off;
* ideal: the same suffix prefill with the prefix KV already resident in the model's ``DynamicCache``
  (perfect, free reuse);
* tiercache: the adapter's request — lookup, load of the cached prefix, suffix prefill.

A hit fraction is a share of the prompt's chunks cached beforehand (rounded down to whole chunks; 100% still
recomputes the last token). Targets: tiercache <= 1.1x ideal at every hit fraction, and at 0% hit
<= 1.05x recompute. TTFT as a fraction of recompute is the user's number. Missed targets are reported, not
failed.

The ratio of record is paired: each repeat runs recompute, ideal and tiercache one after the other, each
repeat's tiercache TTFT is divided by that same repeat's ideal (or recompute, at 0 %), and the median of those
ratios is judged, with the lowest and highest next to it (:mod:`.spread`). On a shared host the model's own
speed drifts between repeats (a 2048-token recompute took 0.98-1.64 s within one run); a pair shares its
moment, so a slow repeat moves both sides of its ratio. The ratio of the medians is reported too.

Primitives:
    configure_parser: add the subcommand's flags to a parser.
    run: run the benchmark from parsed flags; returns the exit status.
    EngineRow: the figures of one (prompt length, hit fraction).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from tiercache.errors import TierCacheError

from .spread import RatioSpread, paired_ratios

logger = logging.getLogger(__name__)

SCHEMA = "tiercache-bench/engine/1"
IDEAL_TARGET = 1.10
MISS_TARGET = 1.05


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: need at least one non-negative integer")
    return values


def _fractions(text: str) -> tuple[int, ...]:
    values = _ints(text)
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
        "--prompt-lengths", type=_ints, default=(512, 1024, 2048, 4096, 8192), help="tokens (512,...,8192)"
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


@dataclass(frozen=True, slots=True)
class EngineRow:
    """Medians (seconds) of one prompt length and hit fraction, and their samples.

    Attributes:
        prompt_tokens: prompt length.
        hit_percent: the requested hit fraction.
        tokens_reused: prompt tokens the tiercache run took from the cache.
        recompute_s, ideal_s, tiercache_s, load_s: medians.
        samples: every timed sample per variant.
    """

    prompt_tokens: int
    hit_percent: int
    tokens_reused: int
    recompute_s: float
    ideal_s: float
    tiercache_s: float
    load_s: float
    samples: dict[str, list[float]]

    @property
    def vs_ideal(self) -> float:
        """TTFT through tiercache over the ideal's (ratio of the medians)."""
        return self.tiercache_s / self.ideal_s

    @property
    def vs_recompute(self) -> float:
        """TTFT through tiercache over full recompute's (ratio of the medians; the user's number)."""
        return self.tiercache_s / self.recompute_s

    @property
    def paired(self) -> RatioSpread:
        """Each repeat's tiercache TTFT over the same repeat's baseline (the ideal; recompute at 0 % hit):
        the median is the ratio of record."""
        baseline = self.samples["recompute" if self.hit_percent == 0 else "ideal"]
        return paired_ratios(self.samples["tiercache"], baseline)

    @property
    def target(self) -> str:
        """The target of this row."""
        return (
            f"<= {MISS_TARGET:.2f}x recompute" if self.hit_percent == 0 else f"<= {IDEAL_TARGET:.2f}x ideal"
        )

    @property
    def met(self) -> bool:
        """Whether the row meets its target, by the median paired ratio."""
        return self.paired.median <= (MISS_TARGET if self.hit_percent == 0 else IDEAL_TARGET)


def _tokens(seed: int, n: int, vocab: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return [int(t) for t in torch.randint(0, vocab, (n,), generator=gen)]


def _timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


class _Bench:
    """The model, the adapters and the measurements of one run."""

    def __init__(self, args: argparse.Namespace, address: str) -> None:
        from tiercache.connector import ClientConfig, ConnectorConfig, TierCacheClient
        from tiercache.connector.hf import HFAdapter, build_reference_model
        from tiercache.connector.hf_cache import ModelRunner

        self.args = args
        self.model = build_reference_model(
            args.seed,
            torch.bfloat16 if args.bf16 else torch.float32,
            hidden_size=args.hidden,
            intermediate_size=2 * args.hidden,
            num_hidden_layers=args.layers,
        )
        # a byte-stream engine stands for one on another host: it has no control socket either
        client_config = ClientConfig(timeout_s=30.0, control_socket=not (args.grpc_only or args.force_remote))
        self.client = TierCacheClient.connect(address, config=client_config)
        salt = f"bench-{uuid.uuid4().hex[:12]}"  # a fresh namespace: nothing cached from earlier runs
        config = ConnectorConfig(force_remote=args.force_remote)
        self.cached = HFAdapter.attach(
            self.model, self.client, args.chunk_tokens, "bench", salt, config=config
        )
        self.off = HFAdapter(self.model, None)
        self.runner = ModelRunner(self.model)
        self.vocab = int(self.model.config.vocab_size)

    def close(self) -> None:
        if self.cached.connector is not None:
            with contextlib.suppress(TierCacheError):
                self.client.purge(self.cached.connector.namespace)
        self.client.close()

    def _ideal(
        self, tokens: Sequence[int], resident: list[tuple[torch.Tensor, torch.Tensor]], start: int
    ) -> float:
        from tiercache.connector.hf_cache import cache_from_prefix

        started = time.perf_counter()
        cache = cache_from_prefix(self.model, resident)
        int(torch.argmax(self.runner.last_logits(tokens[start:], start, cache)).item())
        return time.perf_counter() - started

    def _resident(self, tokens: Sequence[int], start: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        from tiercache.connector.hf_cache import layer_kv, new_cache

        cache = new_cache(self.model)
        if start:
            self.runner.last_logits(tokens[:start], 0, cache)
        return [layer_kv(cache, i) for i in range(self.model.config.num_hidden_layers)] if start else []

    def row(self, tokens: list[int], hit_percent: int) -> EngineRow:
        """Cache ``hit_percent`` of the prompt's chunks (on top of what is cached), then time the variants."""
        c = self.args.chunk_tokens
        hit = (len(tokens) * hit_percent // 100) // c * c
        if hit:
            self.cached.generate(tokens[:hit], 1)  # stores the prefix's chunks
        start = min(hit, len(tokens) - 1)
        resident = self._resident(tokens, start)
        samples: dict[str, list[float]] = {"recompute": [], "ideal": [], "tiercache": [], "load": []}
        reused = 0
        for i in range(self.args.warmup + self.args.repeats):
            rec = self.off.generate(tokens, 1).report.ttft_s
            ideal = self._ideal(tokens, resident, start)
            report = self.cached.generate(tokens, 1, store=False).report
            reused = report.tokens_reused
            if i >= self.args.warmup:
                for name, value in (
                    ("recompute", rec),
                    ("ideal", ideal),
                    ("tiercache", report.ttft_s),
                    ("load", report.load_s),
                ):
                    samples[name].append(value)
        med = {k: statistics.median(v) for k, v in samples.items()}
        return EngineRow(
            len(tokens),
            hit_percent,
            reused,
            med["recompute"],
            med["ideal"],
            med["tiercache"],
            med["load"],
            samples,
        )

    def rows(self, progress: Callable[[str], None]) -> Iterator[EngineRow]:
        for n in self.args.prompt_lengths:
            tokens = _tokens(self.args.seed * 7919 + n, n, self.vocab)
            for pct in sorted(self.args.hit_fractions):
                progress(f"prompt {n} tokens, {pct}% hit")
                yield self.row(tokens, pct)


def format_table(rows: Sequence[EngineRow], header: str) -> str:
    """The TTFT table: medians in ms, the ratio of the medians, and the paired ratio (median, lowest and
    highest repeat) that is judged against the target."""
    head: tuple[str, ...] = (
        "prompt",
        "hit%",
        "reused",
        "recompute ms",
        "ideal ms",
        "tiercache ms",
        "load ms",
        "tc/ideal",
    )
    head = (*head, "tc/recompute", "paired (low-high)", "target", "")
    body = [
        (
            str(r.prompt_tokens),
            str(r.hit_percent),
            str(r.tokens_reused),
            f"{r.recompute_s * 1e3:.1f}",
            f"{r.ideal_s * 1e3:.1f}",
            f"{r.tiercache_s * 1e3:.1f}",
            f"{r.load_s * 1e3:.2f}",
            f"{r.vs_ideal:.3f}x",
            f"{r.vs_recompute:.3f}",
            f"{r.paired.median:.3f}x ({r.paired.low:.3f}-{r.paired.high:.3f})",
            r.target,
            "ok" if r.met else "MISSED",
        )
        for r in rows
    ]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i >= 10 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([header, line(head), *(line(b) for b in body)])


def _to_json(rows: Sequence[EngineRow], config: dict[str, Any]) -> dict[str, Any]:
    out = []
    for r in rows:
        item = asdict(r)
        item.update(
            vs_ideal=r.vs_ideal,
            vs_recompute=r.vs_recompute,
            paired=asdict(r.paired),
            target=r.target,
            met=r.met,
        )
        out.append(item)
    return {"schema": SCHEMA, "config": config, "rows": out}


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
        bench = _Bench(args, address)
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
        args.json.write_text(json.dumps(_to_json(rows, config), indent=2) + "\n")
    print(format_table(rows, header))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run standalone (``python -m tiercache.bench.engine``)."""
    parser = argparse.ArgumentParser(prog="tiercache-bench engine")
    configure_parser(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main())
