"""The KV layouts a benchmark measures: model-like presets and ``LAYERSxHEADSxDIM`` shapes at a chunk size.

Shared by the ``connector`` and ``workload`` benchmarks, which take the same ``--layouts`` argument.

Primitives:
    PRESETS: named (layers, kv heads, head dim) shapes.
    LayoutCase: one layout at one chunk size, and its bf16 :class:`~tiercache.layout.KVLayout`.
    parse_layouts: the ``--layouts`` argument type.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from tiercache.layout import KVDtype, KVLayout

PRESETS: dict[str, tuple[int, int, int]] = {
    "7b": (32, 8, 128),
    "1b": (16, 8, 64),
    "tiny": (4, 2, 64),
}
"""Named layouts: (layers, kv heads, head dim), bf16. ``7b`` is Llama-2/3-7B/8B-like with GQA."""


@dataclass(frozen=True, slots=True)
class LayoutCase:
    """A KV layout measured by a benchmark.

    Attributes:
        name: preset name or ``LxHxD``.
        num_layers: layers.
        num_kv_heads: KV heads.
        head_dim: head dimension.
        chunk_tokens: tokens per chunk.
    """

    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    chunk_tokens: int = 256

    @property
    def label(self) -> str:
        """``7b/256t``."""
        return f"{self.name}/{self.chunk_tokens}t"

    def layout(self) -> KVLayout:
        """The bf16 layout (page size 16 tokens when the chunk allows it)."""
        page = 16 if self.chunk_tokens % 16 == 0 else self.chunk_tokens
        return KVLayout(
            self.num_layers, self.num_kv_heads, self.head_dim, KVDtype.BFLOAT16, self.chunk_tokens, page
        )


def parse_layouts(text: str) -> tuple[tuple[str, int, int, int], ...]:
    """Comma-separated layouts: preset names (``7b``, ``1b``, ``tiny``) or ``LAYERSxHEADSxDIM``.

    Raises:
        argparse.ArgumentTypeError: an unknown name or a malformed shape.
    """
    out = []
    for part in (p.strip().lower() for p in text.split(",") if p.strip()):
        if part in PRESETS:
            out.append((part, *PRESETS[part]))
            continue
        dims = part.split("x")
        if len(dims) != 3 or not all(d.isdigit() and int(d) > 0 for d in dims):
            valid = ", ".join(PRESETS)
            raise argparse.ArgumentTypeError(f"unknown layout {part!r}; use {valid} or LAYERSxHEADSxDIM")
        out.append((part, int(dims[0]), int(dims[1]), int(dims[2])))
    if not out:
        raise argparse.ArgumentTypeError("at least one layout is needed")
    return tuple(out)
