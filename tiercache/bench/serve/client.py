"""The concurrent client of ``tiercache-bench serve``: a workload's sessions against a ``vllm serve``.

Why not ``vllm bench serve``: its datasets take text prompts through a tokenizer (the bench's model has
none: prompts are token ids) and none of them resends a growing history with the previous outputs, which
is the multi-turn case this bench exists for. So an asyncio client (httpx, which vLLM installs) streams
``/v1/completions`` with token-id prompts, greedy, a fixed ``max_tokens`` with EOS ignored,
``return_token_ids`` (the output ids, for the greedy check and the next turn's history) and the usage
chunk (``prompt_tokens_details.cached_tokens``: prompt tokens vLLM did not compute, from its own prefix
cache or a KV connector), and the run's ``kv_transfer_params`` if any (the connector's per-request
control, e.g. ``tiercache_skip_save``: the control that measures what one part of the connector costs).

``concurrency`` workers take turns from one queue: every session's first turn, in order; a session's next
turn joins the back of the queue when its previous turn finishes (see :mod:`.workloads`). A request that
fails (HTTP error, broken stream, timeout) is recorded with its error and its session goes on with the
next turn (the history without that turn's output).

Primitives:
    Outcome: one request's timings, tokens and error.
    drive: run a workload at a concurrency; the outcomes in completion order.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from .workloads import Session, Workload

logger = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 600.0


@dataclass(frozen=True, slots=True)
class Outcome:
    """One request.

    Attributes:
        session: the session's index in the workload.
        turn: the turn's index in the session.
        start: wall clock (``time.monotonic``) when it was sent.
        ttft_s: seconds to its first output token (0 when it failed first).
        itl_s: mean seconds between its consecutive output tokens (first to last, over their count).
        end: when its last byte came.
        prompt_tokens: its prompt's length.
        output: its output token ids.
        cached_tokens: prompt tokens vLLM reported not computed (its cache or a connector).
        reusable_tokens: tokens of the session's previous turn (prompt and output) an engine could have kept,
            whole blocks of them (0 on a first turn or without history): whole-turn reuse is
            ``cached_tokens >= reusable_tokens > 0``.
        error: why it failed ("" when it succeeded).
    """

    session: int
    turn: int
    start: float
    ttft_s: float
    itl_s: float
    end: float
    prompt_tokens: int
    output: tuple[int, ...]
    cached_tokens: int
    reusable_tokens: int
    error: str = ""


def _prompt(session: Session, turn: int, outputs: list[tuple[int, ...]]) -> list[int]:
    if not session.history:
        return [*session.prefix, *session.turns[turn]]
    tokens = list(session.prefix)
    for t in range(turn):
        tokens += [*session.turns[t], *outputs[t]]
    return tokens + list(session.turns[turn])


async def _request(
    client: httpx.AsyncClient, url: str, model: str, prompt: list[int], max_tokens: int,
    kv_transfer_params: Mapping[str, Any],
) -> tuple[float, list[float], list[int], int]:  # fmt: skip
    """Stream one completion: (TTFT, token arrival times, output ids, cached prompt tokens)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
            "return_token_ids": True}  # fmt: skip
    if kv_transfer_params:
        body["kv_transfer_params"] = dict(kv_transfer_params)
    t0 = time.monotonic()
    arrivals: list[float] = []
    ids: list[int] = []
    cached = 0
    async with client.stream("POST", f"{url}/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            text = (await resp.aread()).decode(errors="replace")
            raise RuntimeError(f"HTTP {resp.status_code}: {text[:300]}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or ():
                new = choice.get("token_ids") or []
                if new:
                    ids += new
                    arrivals += [time.monotonic()] * len(new)
            usage = chunk.get("usage")
            if usage:
                cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    if len(ids) != max_tokens:
        raise RuntimeError(f"{len(ids)} output tokens, expected {max_tokens}")
    return arrivals[0] - t0, arrivals, ids, cached


def _itl(arrivals: list[float]) -> float:
    """Mean seconds between consecutive output tokens (a stream chunk may carry several tokens at once)."""
    return (arrivals[-1] - arrivals[0]) / (len(arrivals) - 1) if len(arrivals) > 1 else 0.0


def _reusable(session: Session, turn: int, prompt_len: int, output: tuple[int, ...], block: int) -> int:
    if not session.history or turn == 0:
        return 0
    # The previous turn's KV: its prompt and its outputs but the last (never fed back), whole blocks.
    return (prompt_len + len(output) - 1) // block * block


async def _drive(
    url: str,
    model: str,
    workload: Workload,
    concurrency: int,
    block_size: int,
    on_done: Callable[[Outcome], None] | None,
    kv_transfer_params: Mapping[str, Any],
) -> list[Outcome]:
    queue: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
    for s in range(len(workload.sessions)):
        queue.put_nowait((s, 0))
    outputs: list[list[tuple[int, ...]]] = [[] for _ in workload.sessions]
    previous: list[tuple[int, tuple[int, ...]]] = [(0, ()) for _ in workload.sessions]
    outcomes: list[Outcome] = []
    left = workload.requests
    finished = asyncio.Event()
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal left
        while left > 0:
            get = asyncio.ensure_future(queue.get())
            stop = asyncio.ensure_future(finished.wait())
            await asyncio.wait({get, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not get.done():
                get.cancel()
                stop.cancel()
                return
            stop.cancel()
            s, t = get.result()
            session = workload.sessions[s]
            prompt = _prompt(session, t, outputs[s])
            reusable = _reusable(session, t, *previous[s], block_size)
            start = time.monotonic()
            try:
                ttft, arrivals, ids, cached = await _request(
                    client, url, model, prompt, workload.max_tokens, kv_transfer_params
                )
                out = tuple(ids)
                outcome = Outcome(s, t, start, ttft, _itl(arrivals),
                                  time.monotonic(), len(prompt), out, cached, reusable)  # fmt: skip
            except (httpx.HTTPError, RuntimeError, ValueError) as exc:
                out = ()
                outcome = Outcome(s, t, start, 0.0, 0.0, time.monotonic(), len(prompt), out, 0, reusable,
                                  f"{type(exc).__name__}: {exc}"[:300])  # fmt: skip
                logger.warning("request (session %d, turn %d) failed: %s", s, t, outcome.error)
            outputs[s].append(out)
            previous[s] = (len(prompt), out)
            outcomes.append(outcome)
            if on_done is not None:
                on_done(outcome)
            left -= 1
            if t + 1 < len(session.turns):
                queue.put_nowait((s, t + 1))
            if left == 0:
                finished.set()

    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return outcomes


def drive(
    url: str,
    model: str,
    workload: Workload,
    concurrency: int,
    block_size: int,
    on_done: Callable[[Outcome], None] | None = None,
    kv_transfer_params: Mapping[str, Any] | None = None,
) -> list[Outcome]:
    """Run every request of ``workload`` against the server at ``url`` with ``concurrency`` in flight.

    Args:
        url: the server's base URL.
        model: the served model's name (its path).
        workload: the sessions.
        concurrency: requests in flight at most.
        block_size: the engine's block size (for whole-turn reuse).
        on_done: told of each outcome as it comes (e.g. to kill the daemon after some time).
        kv_transfer_params: sent with every request (vLLM hands them to its KV connector; none when empty).

    Returns:
        Every request's outcome, in completion order.
    """
    params = kv_transfer_params or {}
    return asyncio.run(_drive(url, model, workload, concurrency, block_size, on_done, params))
