"""Attach a Hugging Face transformers model to a running tiercache daemon and generate twice.

The model is a small Llama built from a config with random weights drawn from a fixed seed (no download),
so the example runs anywhere. The first run computes the prompt's KV and stores its full chunks in the
daemon; the second run of the same prompt loads that prefix instead of recomputing it, and generates the
same tokens. Start a daemon first (``tiercache-daemon``), then::

    python connector/examples/hf_generate.py                      # the daemon's default socket
    python connector/examples/hf_generate.py unix:/run/tiercache/daemon.sock

The last line printed is a JSON summary of both runs (what ``tests/connector/test_examples.py`` reads).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from tiercache.connector import ClientConfig, TierCacheClient
from tiercache.connector.hf import HFAdapter, build_reference_model
from tiercache.connector.local_daemon import default_socket

MODEL = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4}
"""4 layers, 8 query heads, 2 KV heads of 32 dims: float32 chunks of 16 tokens are 32 KiB."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "address", nargs="?", default=None, help="daemon address (default: unix:<the default socket>)"
    )
    parser.add_argument("--prompt-tokens", type=int, default=200, help="prompt length (200)")
    parser.add_argument("--new-tokens", type=int, default=8, help="tokens generated per run (8)")
    parser.add_argument("--chunk-tokens", type=int, default=16, help="tokens per cached chunk (16)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the prompt (0)")
    args = parser.parse_args()
    address = args.address or f"unix:{default_socket()}"

    torch.set_num_threads(1)  # chunk copies are memory-bound; spare the daemon's cores
    model = build_reference_model(args.seed, torch.float32, **MODEL)
    gen = torch.Generator().manual_seed(args.seed)
    vocab = int(model.config.vocab_size)
    prompt = [int(t) for t in torch.randint(0, vocab, (args.prompt_tokens,), generator=gen)]

    runs = []
    with TierCacheClient.connect(address, config=ClientConfig(timeout_s=10.0)) as client:
        adapter = HFAdapter.attach(model, client, args.chunk_tokens, revision=f"seed{args.seed}")
        for run in (1, 2):
            out = adapter.generate(prompt, args.new_tokens)
            r = out.report
            print(
                f"run {run}: {r.prompt_tokens} prompt tokens, {r.tokens_reused} reused from the cache "
                f"({r.source}), {r.tokens_recomputed} recomputed, {r.tokens_stored} stored; "
                f"TTFT {r.ttft_s * 1e3:.1f} ms"
            )
            runs.append({"reused": r.tokens_reused, "stored": r.tokens_stored, "tokens": list(out.tokens)})
    same = runs[0]["tokens"] == runs[1]["tokens"]
    print(f"second run hit the cache: {runs[1]['reused'] > 0}; same tokens: {same}")
    print(json.dumps({"address": address, "runs": runs, "same_tokens": same}))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
