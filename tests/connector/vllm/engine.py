"""A vLLM engine process for the connector tests: runs batches of token prompts, says one message.

Usage: ``python engine.py``, spoken to with the line protocol of :mod:`tiercache.testing.engine` (the params
on stdin, the result as its one message; vLLM logs to stdout too). Params:
    model: the model directory; revision: its revision (optional).
    extra: ``kv_connector_extra_config`` of the tiercache connector, or null for no connector.
    connector: the connector class (``TierCacheConnector``, ``RecordingConnector`` from ``recording.py`` or
        ``GatedConnector`` from ``gated.py``).
    multiprocess: run EngineCore and Worker in their own processes (vLLM's default mode).
    batches: lists of prompts ``{"tokens": [...], "salt": "...", "lora": "<adapter dir>"}`` (salt and lora
        optional), generated one batch after the other.
    kill_pid: SIGKILL this process (the daemon) after the first batch, and wait until it is gone.
    abort: ``{"tokens": [...], "steps": n}``: step a long prompt n engine steps, abort it, then run the
        batches (which flush the abort to the worker).
    held: ``{"tokens": [...]}`` (with ``GatedConnector``, after ``abort``): serve the prompt (one output
        token) while the gate holds its commit, step the engine twice, open the gate, step until vLLM frees
        the request; the figures seen on the way go to the output's ``held``.
    max_tokens, block_size, max_num_batched_tokens: engine options.
    metrics: collect vLLM's own stats; the result's ``prefix_cache`` holds its prefix-cache counters
        (``vllm:prefix_cache_hits``: tokens from its own cache, ``vllm:external_prefix_cache_hits``: from
        the connector, ...) after the batches.
The result: ``{"batches": [[{"tokens": [...], "cached": n}, ...], ...], "open_saves": n}``.
"""

from __future__ import annotations

import os
import select
import signal
import time
from typing import Any

from tiercache.testing.engine import read_params, say


def _kill(pid: int) -> None:
    fd = os.pidfd_open(pid)
    try:
        os.kill(pid, signal.SIGKILL)
        select.select([fd], [], [], 30.0)  # readable once the process has exited
    finally:
        os.close(fd)


def _step_until_freed(engine: Any, scheduler: Any, seconds: float = 60.0) -> None:
    """Step the engine until vLLM holds no request, i.e. the connector reported every held one as saved.

    Bounded by time, not by a count of steps: the drop or commit that ends a save runs on the connector's
    save thread, which runs at a lower priority and can wait a long time for a CPU on a busy 2-core host
    while this loop steps; a short pause between steps leaves it the CPU.
    """
    deadline = time.monotonic() + seconds
    while scheduler.requests and time.monotonic() < deadline:
        engine.step()
        time.sleep(0.001)


def _held(llm: Any, tokens: list[int]) -> dict[str, Any]:
    """Finish a request while its save is in flight (the gate is closed); see the module docstring."""
    from vllm import SamplingParams
    from vllm.distributed.kv_transfer import get_kv_transfer_group
    from vllm.inputs import TokensPrompt

    from tiercache.keys import chunk_keys

    conn = get_kv_transfer_group()
    engine = llm.llm_engine
    scheduler = engine.engine_core.engine_core.scheduler
    pool = scheduler.kv_cache_manager.block_pool
    ns = conn.identity.namespace()
    keys = chunk_keys(ns, tokens)
    _step_until_freed(engine, scheduler)  # what earlier requests (an abort) still hold
    idle_before = not scheduler.requests
    free_before = pool.get_num_free_blocks()
    engine.add_request("held", TokensPrompt(prompt_token_ids=tokens), SamplingParams(max_tokens=1))
    finished = False
    for _ in range(50):
        finished = any(o.request_id == "held" and o.finished for o in engine.step())
        if finished:
            break
    seen: dict[str, Any] = {"finished": finished, "idle_before": idle_before, "free_before": free_before}
    seen["held_blocks"] = free_before - pool.get_num_free_blocks()
    engine.step()
    engine.step()
    seen["held_after_steps"] = len(scheduler.requests)  # (vLLM suffixes the ids: count, don't look up)
    seen["held_blocks_after_steps"] = free_before - pool.get_num_free_blocks()
    seen["visible_in_flight"] = conn.client.lookup(ns, keys).chunks
    conn.gate.set()
    seen["committed"] = conn.committed.wait(60.0)
    _step_until_freed(engine, scheduler)  # vLLM frees the blocks at the first step that reports the request
    seen["released"] = not scheduler.requests
    seen["free_after"] = pool.get_num_free_blocks()
    seen["visible_after"] = conn.client.lookup(ns, keys).chunks
    seen["tickets_closed"] = [not conn.client.abort_store(ns, t) for t in conn.tickets]
    return seen


def main() -> None:
    p = read_params()
    if not p.get("multiprocess"):
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    kv = None
    if p.get("extra") is not None:
        module = {"RecordingConnector": "recording", "GatedConnector": "gated"}
        kv = KVTransferConfig(
            kv_connector=p.get("connector", "TierCacheConnector"),
            kv_connector_module_path=module.get(p.get("connector", ""), "tiercache.connector.vllm"),
            kv_role="kv_both",
            kv_load_failure_policy="recompute",
            kv_connector_extra_config=p["extra"],
        )
    options: dict[str, Any] = {}
    if p.get("max_num_batched_tokens"):
        options["max_num_batched_tokens"] = p["max_num_batched_tokens"]
    if p.get("metrics"):
        options["disable_log_stats"] = False
    if any(r.get("lora") for batch in p.get("batches", []) for r in batch):
        options.update(enable_lora=True, max_lora_rank=8, max_loras=1)
    llm = LLM(
        model=p["model"],
        revision=p.get("revision"),
        skip_tokenizer_init=True,
        dtype="float32",
        block_size=p.get("block_size", 32),
        max_model_len=4096,
        max_num_seqs=8,
        enforce_eager=True,
        kv_transfer_config=kv,
        seed=0,
        **options,
    )
    sp = SamplingParams(max_tokens=p.get("max_tokens", 4), temperature=0.0, ignore_eos=True)
    out: dict[str, Any] = {"batches": []}
    if p.get("abort"):
        from vllm.distributed.kv_transfer import get_kv_transfer_group

        engine = llm.llm_engine
        engine.add_request("aborted", TokensPrompt(prompt_token_ids=p["abort"]["tokens"]), sp)
        for _ in range(p["abort"]["steps"]):
            engine.step()
        out["open_saves"] = get_kv_transfer_group()._w().open_saves
        engine.abort_request(["aborted"])
    if p.get("held"):
        out["held"] = _held(llm, p["held"]["tokens"])
    for i, batch in enumerate(p.get("batches", [])):
        prompts = [
            TokensPrompt(prompt_token_ids=r["tokens"], cache_salt=r["salt"])
            if r.get("salt")
            else TokensPrompt(prompt_token_ids=r["tokens"])
            for r in batch
        ]
        loras = [LoRARequest("adapter", 1, r["lora"]) if r.get("lora") else None for r in batch]
        outs = llm.generate(prompts, sp, use_tqdm=False, lora_request=loras)
        out["batches"].append(
            [{"tokens": list(o.outputs[0].token_ids), "cached": o.num_cached_tokens} for o in outs]
        )
        if i == 0 and p.get("kill_pid"):
            _kill(int(p["kill_pid"]))
    if p.get("metrics"):
        from vllm.v1.metrics.reader import Counter

        counters = [m for m in llm.get_metrics() if isinstance(m, Counter) and "prefix_cache" in m.name]
        out["prefix_cache"] = {m.name: sum(c.value for c in counters if c.name == m.name) for m in counters}
    say(out)


if __name__ == "__main__":
    main()
