"""The workloads of ``tiercache-bench serve``: seeded token-id sessions, sized to a working set, as JSONL.

A workload is a list of sessions; a session is a prefix (a system prompt, a document, or nothing) and turns
(each a run of new user tokens). A session's turns go one after another; the client queues a session's next
turn behind every other session's ready turn, so that with concurrency 1 the order is round-robin (turn 1 of
every session, then turn 2, ...): the longest reuse distance, where an engine cache that is too small has
dropped what a session comes back for. Three kinds:

* ``system``: many users share one system prompt; each user sends a question and a follow-up (its history);
* ``chat``: N users x M rounds of multi-turn chat, each round resending the growing history with the
  previous outputs (LMCache's multi-round QA shape);
* ``docqa``: D documents x Q questions; each question is the document and the question (no history).

:func:`build` sizes a workload so that its working set (every token whose KV an engine would keep: the
final history of every session, the outputs included) is about ``tokens``; every token is drawn from a seeded
generator (distinct seeds: two workloads never share a block). :func:`write_jsonl` / :func:`read_jsonl`
store and replay a workload, one session per line.

Primitives:
    WorkloadKind: the three kinds.
    Session: a prefix, turns, and whether a turn carries the history.
    Workload: the sessions and the output length.
    build: a workload of a kind, sized to a working set, from a seed.
    write_jsonl / read_jsonl: one session per JSON line.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

VOCAB_LOW, VOCAB_HIGH = 10, 8000
"""Token ids drawn (the bench's model has 8192)."""


class WorkloadKind(enum.Enum):
    """A workload's shape (see the module docstring)."""

    SYSTEM = "system"
    CHAT = "chat"
    DOCQA = "docqa"


@dataclass(frozen=True, slots=True)
class Session:
    """One user's (or document's) requests.

    Attributes:
        prefix: tokens every turn starts with (system prompt or document; may be empty).
        turns: each turn's new tokens.
        history: a turn resends the whole session so far (earlier turns and their outputs) before its new
            tokens; else a turn is the prefix and its own tokens.
    """

    prefix: tuple[int, ...]
    turns: tuple[tuple[int, ...], ...]
    history: bool


@dataclass(frozen=True, slots=True)
class Workload:
    """A named list of sessions.

    Attributes:
        kind: its shape.
        sessions: the sessions.
        max_tokens: output tokens of every request (greedy, EOS ignored).
    """

    kind: WorkloadKind
    sessions: tuple[Session, ...]
    max_tokens: int

    @property
    def requests(self) -> int:
        """Requests in all."""
        return sum(len(s.turns) for s in self.sessions)

    @property
    def working_set_tokens(self) -> int:
        """Distinct tokens whose KV an engine would keep to serve every request from its cache."""
        shared: set[tuple[int, ...]] = set()
        total = 0
        for s in self.sessions:
            if s.prefix not in shared:
                shared.add(s.prefix)
                total += len(s.prefix)
            own = sum(len(t) for t in s.turns)
            total += own + (len(s.turns) * self.max_tokens if s.history else 0)
        return total

    @property
    def longest_prompt(self) -> int:
        """The longest prompt plus its output (the server's max model length must hold it)."""
        return max(
            len(s.prefix)
            + (
                sum(len(t) for t in s.turns) + len(s.turns) * self.max_tokens
                if s.history
                else max(map(len, s.turns))
            )
            for s in self.sessions
        )


@dataclass(frozen=True, slots=True)
class _Shape:
    prefix: int  # tokens of the shared prefix (system) or each session's own prefix (docqa)
    first: int  # the first turn's new tokens
    then: int  # each later turn's new tokens
    turns: int


_SHAPES = {
    WorkloadKind.SYSTEM: _Shape(prefix=512, first=128, then=64, turns=2),
    WorkloadKind.CHAT: _Shape(prefix=0, first=256, then=64, turns=4),
    WorkloadKind.DOCQA: _Shape(prefix=768, first=32, then=32, turns=4),
}


def _tokens(gen: torch.Generator, n: int) -> tuple[int, ...]:
    return tuple(int(t) for t in torch.randint(VOCAB_LOW, VOCAB_HIGH, (n,), generator=gen))


def build(kind: WorkloadKind, tokens: int, seed: int, max_tokens: int) -> Workload:
    """A workload of ``kind`` whose working set is about ``tokens`` (at least one session).

    Raises:
        ValueError: ``tokens`` or ``max_tokens`` is not positive.
    """
    if tokens <= 0 or max_tokens <= 0:
        raise ValueError(f"tokens and max_tokens must be > 0, got {tokens} and {max_tokens}")
    shape = _SHAPES[kind]
    gen = torch.Generator().manual_seed(seed)
    own = shape.first + (shape.turns - 1) * shape.then
    if kind is WorkloadKind.SYSTEM:
        per = own + shape.turns * max_tokens
        count = max(1, (tokens - shape.prefix) // per)
        system = _tokens(gen, shape.prefix)
        prefixes = [system] * count
    elif kind is WorkloadKind.CHAT:
        count = max(1, tokens // (own + shape.turns * max_tokens))
        prefixes = [()] * count
    else:
        count = max(1, tokens // (shape.prefix + own))
        prefixes = [_tokens(gen, shape.prefix) for _ in range(count)]
    sessions = tuple(
        Session(
            prefix=prefix,
            turns=tuple(_tokens(gen, shape.first if t == 0 else shape.then) for t in range(shape.turns)),
            history=kind is not WorkloadKind.DOCQA,
        )
        for prefix in prefixes
    )
    return Workload(kind, sessions, max_tokens)


def write_jsonl(workload: Workload, path: Path) -> None:
    """Write ``workload`` as JSONL: one ``{"kind", "max_tokens", "prefix", "turns", "history"}`` per session."""
    with path.open("w") as f:
        for s in workload.sessions:
            line = {"kind": workload.kind.value, "max_tokens": workload.max_tokens, "prefix": list(s.prefix),
                    "turns": [list(t) for t in s.turns], "history": s.history}  # fmt: skip
            f.write(json.dumps(line) + "\n")


def read_jsonl(path: Path) -> Workload:
    """Read a workload written by :func:`write_jsonl`.

    Raises:
        ValueError: naming the line and field, when a line is not a session of one workload.
    """
    sessions: list[Session] = []
    kinds: set[str] = set()
    outputs: set[int] = set()
    for n, text in enumerate(path.read_text().splitlines(), 1):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
            kinds.add(str(line["kind"]))
            outputs.add(int(line["max_tokens"]))
            sessions.append(
                Session(_ints(line["prefix"]), tuple(_ints(t) for t in line["turns"]), bool(line["history"]))
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}:{n}: not a session ({type(exc).__name__}: {exc})") from None
    if len(kinds) != 1 or len(outputs) != 1:
        raise ValueError(
            f"{path}: needs one kind and one max_tokens, got {sorted(kinds)} and {sorted(outputs)}"
        )
    return Workload(WorkloadKind(kinds.pop()), tuple(sessions), outputs.pop())


def _ints(values: Sequence[object]) -> tuple[int, ...]:
    if not isinstance(values, list) or not all(isinstance(v, int) and v >= 0 for v in values):
        raise ValueError("token ids must be a list of non-negative integers")
    return tuple(int(v) for v in values)  # type: ignore[call-overload, unused-ignore]
