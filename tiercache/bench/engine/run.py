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
ratios is judged, with the lowest and highest next to it (:mod:`..common.spread`). On a shared host the model's own
speed drifts between repeats (a 2048-token recompute took 0.98-1.64 s within one run); a pair shares its
moment, so a slow repeat moves both sides of its ratio. The ratio of the medians is reported too.

Primitives:
    IDEAL_TARGET, MISS_TARGET: the targets (ratio to the ideal; to recompute at 0 % hit).
    EngineRow: the figures of one (prompt length, hit fraction).
    EngineBench: the model, the adapters and the measurements of one run.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from tiercache.errors import TierCacheError

from ..common.spread import RatioSpread, paired_ratios

logger = logging.getLogger(__name__)

IDEAL_TARGET = 1.10
MISS_TARGET = 1.05


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


class EngineBench:
    """The model, the adapters and the measurements of one run."""

    def __init__(self, args: argparse.Namespace, address: str) -> None:
        from tiercache.connector import ClientConfig, ConnectorConfig, DataPlaneMode, TierCacheClient
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
        config = ConnectorConfig(DataPlaneMode.STREAM if args.force_remote else DataPlaneMode.AUTO)
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
