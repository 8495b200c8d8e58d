"""Request traces for the ``workload`` benchmark: synthetic generators and the JSONL trace format.

Synthetic traces (:class:`TraceKind`), all seeded:
    system_prompt: one shared system prompt + a unique query per request.
    chat: sessions of multi-turn chat; each turn's prompt is the whole history (previous prompt, answer)
        plus the new user turn, so the shared prefix grows every turn. Sessions interleave at random.
    rag: a shared system prompt, ``docs_per_request`` documents drawn from a hot set by a Zipf law
        (rank r with weight ``1 / r**zipf_s``), then a unique query.
    unique: unique prompts, no reuse (the cache can only lose).
    thrash: a cycle over distinct prompts whose total exceeds ``working_set_tokens`` (set it above
        L1+L2): each prompt comes back only after all the others, the worst case for LRU.

JSONL format (one request per line, blank lines and lines starting with ``#`` ignored). Either explicit
token ids::

    {"tokens": [101, 2023, 2003, ...]}

or lengths and shared-prefix ids, expanded deterministically::

    {"prefix": [{"id": "system-v1", "tokens": 2048}, {"id": "doc-17", "tokens": 1024}], "unique_tokens": 200}

Each prefix id stands for the same random token ids wherever it appears (seeded by the id; an id must
always have the same length); ``unique_tokens`` fresh random ids follow. ``"tag"`` (a string) is optional
in both forms. Token ids must be in ``[0, 2**32)``.

Primitives:
    TraceRequest: one request's token ids and tag.
    TraceKind: the synthetic traces.
    TraceSpec: the sizes of a synthetic trace.
    generate_trace: a synthetic trace (Enum-keyed registry of generators).
    read_jsonl: the JSONL format.
    TraceFormatError: a malformed JSONL line (names the line).
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

VOCAB = 32000
"""Synthetic token ids are drawn from ``[0, VOCAB)``."""
_MAX_TOKEN = 2**32 - 1


@dataclass(frozen=True, slots=True, eq=False)
class TraceRequest:
    """One request of a trace.

    Attributes:
        tokens: the prompt's token ids (1-D ``uint32``).
        tag: where it comes from (e.g. ``chat/s3/t2``), for reading traces.
    """

    tokens: np.ndarray
    tag: str = ""


class TraceKind(enum.Enum):
    """The synthetic traces (values are their names on the command line)."""

    SYSTEM_PROMPT = "system_prompt"
    CHAT = "chat"
    RAG = "rag"
    UNIQUE = "unique"
    THRASH = "thrash"


@dataclass(frozen=True, slots=True)
class TraceSpec:
    """Sizes of a synthetic trace (each generator uses the fields that concern it).

    Attributes:
        requests: requests in the trace.
        system_tokens: tokens of the shared system prompt (system_prompt, chat, rag).
        query_tokens: tokens of a unique query or user turn.
        answer_tokens: tokens of a chat answer appended to the history.
        sessions: concurrent chat sessions.
        documents: RAG corpus size; ``doc_tokens`` each.
        doc_tokens: tokens per RAG document.
        docs_per_request: documents in a RAG prompt.
        zipf_s: Zipf exponent of document popularity.
        prompt_tokens: tokens of a unique / thrash prompt.
        working_set_tokens: thrash: the cycle's total tokens exceed this.
        seed: generator seed.
    """

    requests: int = 200
    system_tokens: int = 1024
    query_tokens: int = 256
    answer_tokens: int = 256
    sessions: int = 8
    documents: int = 64
    doc_tokens: int = 1024
    docs_per_request: int = 2
    zipf_s: float = 1.1
    prompt_tokens: int = 2048
    working_set_tokens: int = 1 << 16
    seed: int = 0

    def __post_init__(self) -> None:
        ints = ("requests", "sessions", "documents", "doc_tokens", "docs_per_request", "prompt_tokens")
        for name in ints:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.docs_per_request > self.documents:
            raise ValueError("docs_per_request cannot exceed documents")
        if self.zipf_s <= 0:
            raise ValueError(f"zipf_s must be positive, got {self.zipf_s}")


def _random_tokens(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, VOCAB, size=n, dtype=np.int64).astype(np.uint32)


def _segment(name: str, n: int) -> np.ndarray:
    """The token ids of a named shared segment (deterministic in its name and length)."""
    seed = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")
    return _random_tokens(np.random.default_rng(seed), n)


def _system_prompt(spec: TraceSpec, rng: np.random.Generator) -> list[TraceRequest]:
    system = _segment(f"system/{spec.seed}", spec.system_tokens)
    return [
        TraceRequest(np.concatenate([system, _random_tokens(rng, spec.query_tokens)]), f"system_prompt/q{i}")
        for i in range(spec.requests)
    ]


def _chat(spec: TraceSpec, rng: np.random.Generator) -> list[TraceRequest]:
    system = _segment(f"chat-system/{spec.seed}", spec.system_tokens)
    histories = [system.copy() for _ in range(spec.sessions)]
    turns = [0] * spec.sessions
    out = []
    for _ in range(spec.requests):
        s = int(rng.integers(0, spec.sessions))
        prompt = np.concatenate([histories[s], _random_tokens(rng, spec.query_tokens)])
        out.append(TraceRequest(prompt, f"chat/s{s}/t{turns[s]}"))
        histories[s] = np.concatenate([prompt, _random_tokens(rng, spec.answer_tokens)])
        turns[s] += 1
    return out


def _rag(spec: TraceSpec, rng: np.random.Generator) -> list[TraceRequest]:
    system = _segment(f"rag-system/{spec.seed}", spec.system_tokens)
    docs = [_segment(f"doc/{spec.seed}/{d}", spec.doc_tokens) for d in range(spec.documents)]
    weights = 1.0 / np.arange(1, spec.documents + 1, dtype=np.float64) ** spec.zipf_s
    weights /= weights.sum()
    out = []
    for i in range(spec.requests):
        picked = rng.choice(spec.documents, size=spec.docs_per_request, replace=False, p=weights)
        parts = [system, *(docs[int(d)] for d in picked), _random_tokens(rng, spec.query_tokens)]
        out.append(
            TraceRequest(np.concatenate(parts), f"rag/q{i}/docs{'-'.join(str(int(d)) for d in picked)}")
        )
    return out


def _unique(spec: TraceSpec, rng: np.random.Generator) -> list[TraceRequest]:
    return [
        TraceRequest(_random_tokens(rng, spec.prompt_tokens), f"unique/{i}") for i in range(spec.requests)
    ]


def _thrash(spec: TraceSpec, rng: np.random.Generator) -> list[TraceRequest]:
    distinct = spec.working_set_tokens // spec.prompt_tokens + 1
    prompts = [_random_tokens(rng, spec.prompt_tokens) for _ in range(distinct)]
    return [TraceRequest(prompts[i % distinct], f"thrash/p{i % distinct}") for i in range(spec.requests)]


_GENERATORS: Mapping[TraceKind, Callable[[TraceSpec, np.random.Generator], list[TraceRequest]]] = {
    TraceKind.SYSTEM_PROMPT: _system_prompt,
    TraceKind.CHAT: _chat,
    TraceKind.RAG: _rag,
    TraceKind.UNIQUE: _unique,
    TraceKind.THRASH: _thrash,
}


def generate_trace(kind: TraceKind, spec: TraceSpec) -> list[TraceRequest]:
    """The synthetic trace ``kind`` of ``spec`` (the same spec gives the same trace)."""
    return _GENERATORS[kind](spec, np.random.default_rng(spec.seed))


class TraceFormatError(ValueError):
    """A JSONL trace line is malformed (the message names the file and line)."""


@dataclass(slots=True)
class _Segments:
    lengths: dict[str, int] = field(default_factory=dict)

    def tokens(self, name: str, n: int, where: str) -> np.ndarray:
        known = self.lengths.setdefault(name, n)
        if known != n:
            raise TraceFormatError(f"{where}: prefix {name!r} has {n} tokens here, {known} before")
        return _segment(f"jsonl/{name}", n)


def _count(value: Any, what: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TraceFormatError(f"{where}: {what} must be a non-negative integer, got {value!r}")
    return value


def _parse_line(obj: Any, where: str, segments: _Segments, rng: np.random.Generator) -> TraceRequest:
    if not isinstance(obj, dict):
        raise TraceFormatError(f"{where}: expected a JSON object")
    tag = obj.get("tag", "")
    if not isinstance(tag, str):
        raise TraceFormatError(f"{where}: tag must be a string")
    if "tokens" in obj:
        ids = obj["tokens"]
        if not isinstance(ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= _MAX_TOKEN for t in ids
        ):
            raise TraceFormatError(f"{where}: tokens must be a list of integers in [0, 2**32)")
        return TraceRequest(np.asarray(ids, dtype=np.uint32), tag)
    if "prefix" not in obj and "unique_tokens" not in obj:
        raise TraceFormatError(f"{where}: needs 'tokens', or 'prefix' and/or 'unique_tokens'")
    parts = []
    prefix = obj.get("prefix", [])
    if not isinstance(prefix, list):
        raise TraceFormatError(f"{where}: prefix must be a list of {{'id': str, 'tokens': int}}")
    for seg in prefix:
        if not isinstance(seg, dict) or not isinstance(seg.get("id"), str):
            raise TraceFormatError(f"{where}: each prefix entry needs a string 'id' and integer 'tokens'")
        parts.append(segments.tokens(seg["id"], _count(seg.get("tokens"), "prefix tokens", where), where))
    parts.append(_random_tokens(rng, _count(obj.get("unique_tokens", 0), "unique_tokens", where)))
    return TraceRequest(np.concatenate(parts), tag)


def read_jsonl(path: Path, seed: int = 0) -> list[TraceRequest]:
    """Read a JSONL trace (see the module docstring); ``seed`` seeds the unique tokens.

    Raises:
        TraceFormatError: a malformed line, or no request at all.
        OSError: the file cannot be read.
    """
    segments = _Segments()
    rng = np.random.default_rng(seed)
    out = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            where = f"{path}:{n}"
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise TraceFormatError(f"{where}: not JSON: {exc}") from None
            out.append(_parse_line(obj, where, segments, rng))
    if not out:
        raise TraceFormatError(f"{path}: no requests")
    return out
