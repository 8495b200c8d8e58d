"""One vLLM engine process of ``tiercache-bench vllm``: times requests of one output token, says the times.

Run as ``python -m tiercache.bench.vllm_engine``, or by path with another interpreter (the LMCache column
runs it in LMCache's own venv: this module imports nothing of tiercache), and spoken to with the line
protocol of :mod:`tiercache.testing.engine` (restated here, since that module is not importable in LMCache's
venv): the params as one line of JSON on stdin, messages as :data:`MARK` lines on stdout (each engine is its
own process, so that its own prefix cache starts empty). Params:
    model: the model directory; block_size; kv: null (no connector) or ``{"kv_connector": ...,
        "kv_connector_module_path": ..., "kv_connector_extra_config": {...}}``;
    jobs: ``[{"warm": [tokens] | null, "prompt": [tokens]}]``: ``warm`` runs first, untimed (it fills the
        engine's own prefix cache, or stores through the connector), then ``prompt`` is timed;
    wait_go: after the engine started, say ``{"ready": true}`` and wait for a second line on stdin before
        the jobs (so that several engines run their jobs at the same time);
    hide_llvmlite: hide llvmlite's and numba's modules from vLLM's kernel-rebinding scan (see
        :func:`hide_from_kernel_rebind`; the LMCache column needs it).
The result line starts with :data:`RESULT`: ``{"jobs": [{"s": seconds, "cached": tokens, "t0": wall clock
at the start, "t1": at the end}], "start_s": s}``.

Primitives:
    RESULT: prefix of the result line.
    hide_from_kernel_rebind: keep modules out of vLLM's scan for Triton kernels.
    READY: the line printed when the engine waits for the go line.
    main: the entry point.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

MARK = "TIERCACHE-ENGINE "
"""Prefix of a message line (vLLM's processes log to stdout too); equal to tiercache.testing.engine.MARK."""


def _say(message: dict[str, Any]) -> None:
    print(MARK + json.dumps(message), flush=True)


def hide_from_kernel_rebind(prefixes: tuple[str, ...]) -> None:
    """Keep the modules named ``prefixes*`` out of vLLM's kernel-rebinding scan.

    Without Triton, vLLM's CPU platform points every module attribute that holds a Triton kernel at its CPU
    implementation by scanning ``sys.modules`` and reading ``vars(value).get("kernel")`` of every object;
    llvmlite's library objects (imported by LMCache's numba-based token hasher) answer ``vars()`` with a
    non-dict and the scan raises ``AttributeError``, failing engine start. Those modules hold no vLLM kernels,
    so hiding them from the scan changes nothing else.
    """
    from vllm.triton_utils import dispatcher

    scan = dispatcher._rebind_kernels

    def guarded(overrides: Any) -> None:
        hidden = {name: mod for name, mod in list(sys.modules.items()) if name.startswith(prefixes)}
        for name in hidden:
            del sys.modules[name]
        try:
            scan(overrides)
        finally:
            sys.modules.update(hidden)

    dispatcher._rebind_kernels = guarded


def main() -> None:
    """Run the jobs of the params on stdin and say the result."""
    params: dict[str, Any] = json.loads(sys.stdin.readline())
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    if params.get("hide_llvmlite"):
        hide_from_kernel_rebind(("llvmlite", "numba"))
    kv = params.get("kv")
    transfer = None
    if kv is not None:
        transfer = KVTransferConfig(kv_role="kv_both", kv_load_failure_policy="recompute", **kv)
    started = time.perf_counter()
    llm = LLM(
        model=params["model"],
        skip_tokenizer_init=True,
        dtype="float32",
        block_size=params.get("block_size", 32),
        max_model_len=params.get("max_model_len", 8192),
        max_num_batched_tokens=params.get("max_model_len", 8192),
        enforce_eager=True,
        kv_transfer_config=transfer,
        seed=0,
    )
    start_s = time.perf_counter() - started
    if params.get("wait_go"):
        _say({"ready": True})
        sys.stdin.readline()
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    results = []
    for job in params["jobs"]:
        if job.get("warm"):
            llm.generate([TokensPrompt(prompt_token_ids=job["warm"])], one, use_tqdm=False)
        wall, t0 = time.time(), time.perf_counter()
        out = llm.generate([TokensPrompt(prompt_token_ids=job["prompt"])], one, use_tqdm=False)
        seconds = time.perf_counter() - t0
        cached = int(out[0].num_cached_tokens or 0)
        results.append({"s": seconds, "cached": cached, "t0": wall, "t1": wall + seconds})
    _say({"jobs": results, "start_s": start_s})


if __name__ == "__main__":
    main()
