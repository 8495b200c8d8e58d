"""A test observer: ``TierCacheConnector`` that also writes the bytes of the blocks it loaded and saved.

Loaded chunks are written after their load finished (``load-<prefix hash>.bin``), saved chunks when they are
copied into the reservation (``save-<prefix hash>.bin``); the prefix hash covers the prompt's tokens up to
the end of the chunk, so the same chunk of the same prompt has the same name in any engine. The directory
comes from ``$TIERCACHE_TEST_RECORD_DIR``. Imported by vLLM from this directory (on ``PYTHONPATH``).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import torch

from tiercache.connector.vllm import TierCacheConnector
from tiercache.connector.vllm.metadata import TierCacheMetadata


def _name(kind: str, tokens: tuple[int, ...], chunk: int, chunk_tokens: int) -> str:
    prefix = repr(tokens[: (chunk + 1) * chunk_tokens]).encode()
    return f"{kind}-{hashlib.blake2b(prefix, digest_size=16).hexdigest()}.bin"


class RecordingConnector(TierCacheConnector):
    """Writes the bytes of every loaded and every saved chunk (all layers) under the record directory."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._dir = Path(os.environ["TIERCACHE_TEST_RECORD_DIR"])
        self._save_tokens: dict[str, tuple[int, ...]] = {}

    def _blocks(self, block_ids: tuple[int, ...]) -> bytes:
        caches = self._w()._caches
        index = torch.tensor(block_ids, dtype=torch.int64)
        return b"".join(torch.index_select(c, 1, index).contiguous().numpy().tobytes() for c in caches)

    def _write(self, name: str, data: bytes) -> None:
        (self._dir / name).write_bytes(data)

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors = super().get_block_ids_with_load_errors()
        meta = self._meta()
        layout = self.identity.layout
        per = layout.chunk_tokens // layout.page_tokens
        for spec in meta.loads:
            for chunk in range(len(spec.tokens) // layout.chunk_tokens):
                blocks = spec.block_ids[chunk * per : (chunk + 1) * per]
                if len(blocks) == per and chunk * per >= spec.first_block and not errors & set(blocks):
                    self._write(_name("load", spec.tokens, chunk, layout.chunk_tokens), self._blocks(blocks))
        return errors

    def wait_for_save(self) -> None:
        if self.has_connector_metadata():
            meta = self._meta()
            assert isinstance(meta, TierCacheMetadata)
            layout = self.identity.layout
            per = layout.chunk_tokens // layout.page_tokens
            for spec in meta.saves:
                if spec.tokens:
                    self._save_tokens[spec.req_id] = spec.tokens
                tokens = self._save_tokens[spec.req_id]
                for chunk in spec.chunks:
                    blocks = spec.block_ids[chunk * per : (chunk + 1) * per]
                    self._write(_name("save", tokens, chunk, layout.chunk_tokens), self._blocks(blocks))
        super().wait_for_save()
