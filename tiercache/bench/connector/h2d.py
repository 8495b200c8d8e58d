"""The GPU line of ``tiercache-bench connector``: loads from L2 into CUDA tensors against the pinned peak.

An engine on a GPU loads cached KV from the daemon's L2 segment, which the connector maps and registers as
pinned memory (:mod:`tiercache.pinning`), straight into its device tensors. The ceiling is what this device
does at best from host memory: a ``non_blocking`` copy of the same bytes, in the same chunk-sized copies,
from buffers allocated pinned by torch (``pin_memory=True``) into device buffers, synchronized once. Each
timed load is paired with a pass of that copy right before it, and each round's ratio is to its own pass,
as the connector bench does for memcpy (one glitch cannot decide).

Every load is verified byte for byte against the stored KV (a mismatch raises, never a figure). Without
CUDA nothing here runs (:func:`cuda_device` is None) and the bench prints no GPU line.

Primitives:
    H2D_TARGET: the target ratio (issue 13: >= 0.8x the device's pinned-copy peak).
    cuda_device: the device to measure on, or None.
    PinnedPeak: times the pinned host-to-device copy of the same bytes.
    H2DRounds: the paired timings of one case.
    time_h2d: store once per prompt, then time the load into CUDA tensors, paired with the peak.
    measure_h2d: :func:`time_h2d` as the bench's ceiling and figure.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from tiercache.connector import ContiguousKV, KVConnector

from ..ceilings import CeilingKind, CeilingResult
from ..common.kvcheck import verify_kv
from ..common.layout_cases import LayoutCase
from ..common.spread import paired_ratios
from ..common.timing import summarize
from .figure import BenchError, ConnectorFigure, throughput_figure

H2D_TARGET = 0.8
"""Loads from L2 into device tensors, as a ratio to the pinned host-to-device peak."""


def cuda_device() -> torch.device | None:
    """The CUDA device the GPU line measures on (the current one), or None without CUDA."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None


class PinnedPeak:
    """The device's pinned-copy peak for ``chunks`` copies of ``chunk_bytes``, buffers allocated once."""

    def __init__(self, chunk_bytes: int, chunks: int, device: torch.device) -> None:
        self._device = device
        self._srcs = [torch.empty(chunk_bytes, dtype=torch.uint8, pin_memory=True) for _ in range(chunks)]
        for i, src in enumerate(self._srcs):
            src.fill_(i % 251)
        self._dsts = [torch.empty(chunk_bytes, dtype=torch.uint8, device=device) for _ in range(chunks)]
        self.nbytes = chunk_bytes * chunks

    def __call__(self) -> float:
        """Seconds for one pass: every copy queued ``non_blocking``, then one synchronize."""
        torch.cuda.synchronize(self._device)
        t0 = time.perf_counter()
        for src, dst in zip(self._srcs, self._dsts, strict=True):
            dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize(self._device)
        return time.perf_counter() - t0


@dataclass(frozen=True, slots=True)
class H2DRounds:
    """Paired timings of the GPU line of one case.

    Attributes:
        load_s: per timed round, the connector's load of the stored prompt into CUDA tensors.
        peak_s: per timed round, the pinned copy of the same bytes taken right before it.
        verified: bytes compared equal to the stored KV.
        pinned: whether the connector's mapping of the segment is registered as pinned.
    """

    load_s: tuple[float, ...]
    peak_s: tuple[float, ...]
    verified: int
    pinned: bool


def time_h2d(
    conn: KVConnector,
    prompts: Sequence[np.ndarray],
    src: ContiguousKV,
    chunk_bytes: int,
    device: torch.device,
) -> H2DRounds:
    """Store each prompt (untimed), then time its load from L2 into CUDA tensors, after a pass of the peak.

    The first prompt is a warm-up. The namespace is purged after each round (no round evicts another).

    Raises:
        BenchError: the daemon stored or loaded less than the whole prompt.
        RoundTripError: loaded KV differs from the stored KV.
    """
    tokens = len(prompts[0])
    chunks = tokens // conn.namespace.layout.chunk_tokens
    peak = PinnedPeak(chunk_bytes, chunks, device)
    dst = ContiguousKV([torch.zeros_like(t, device=device) for t in src.layers])
    mapping = conn.client.slot_mapping(conn.namespace)
    load_s: list[float] = []
    peak_s: list[float] = []
    verified = 0
    for i, prompt in enumerate(prompts):
        if conn.store(prompt, src).tokens_stored != tokens:
            raise BenchError("h2d: the daemon did not store the whole prompt (too little room?)")
        for t in dst.layers:
            t.zero_()
        before = peak()
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        loaded = conn.load(prompt, dst)
        torch.cuda.synchronize(device)
        took = time.perf_counter() - t0
        if loaded.tokens_loaded != tokens:
            raise BenchError(f"h2d: the daemon loaded {loaded.tokens_loaded} of {tokens} tokens")
        back = ContiguousKV([t.cpu() for t in dst.layers])
        checked = verify_kv(src, back, tokens, conn.namespace.layout.mla)  # the warm-up too
        conn.client.purge(conn.namespace)
        if i:
            verified += checked
            load_s.append(took)
            peak_s.append(before)
    return H2DRounds(tuple(load_s), tuple(peak_s), verified, mapping is not None and mapping.pinned)


def measure_h2d(
    case: LayoutCase,
    conn: KVConnector,
    prompts: Sequence[np.ndarray],
    src: ContiguousKV,
    device: torch.device,
) -> tuple[CeilingResult, ConnectorFigure]:
    """The GPU line of one case: the pinned-copy ceiling and the ``h2d load`` figure (median of the
    per-round ratios, each round to the peak pass taken right before it).

    Raises:
        BenchError, RoundTripError: as :func:`time_h2d`.
    """
    layout = conn.namespace.layout
    chunks = len(prompts[0]) // layout.chunk_tokens
    got = time_h2d(conn, prompts, src, layout.chunk_bytes, device)
    total = chunks * layout.chunk_bytes
    peak = summarize(total * len(got.peak_s), sum(got.peak_s), got.peak_s)
    note = "pinned host buffers; the segment is " + ("pinned" if got.pinned else "NOT pinned (pageable)")
    ceiling = CeilingResult(CeilingKind.PINNED_H2D, str(device), layout.chunk_bytes, peak, note)
    loads = summarize(total * len(got.load_s), sum(got.load_s), got.load_s)
    spread = paired_ratios([total / s for s in got.load_s], [total / s for s in got.peak_s])
    return ceiling, throughput_figure(
        case, layout, chunks, "h2d", "load", loads, ceiling.label, peak.gbps, H2D_TARGET, got.verified, spread
    )
