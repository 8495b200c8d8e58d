"""Where the pages of a slot tier live: partitions of pages that share one budget of resident pages.

A slot tier's memory is one or more *partitions*, each a 2-D ``uint8`` tensor ``[num_pages, page_bytes]``
named by a key (the tenant whose chunks it holds; ``""`` is the default partition, given at construction).
A chunk takes one run of consecutive pages of its partition (:mod:`tiercache.tiers.runs`: best fit, and a
run given back merges with its free neighbours). A partition is a hard wall: its pages are only ever handed
to chunks of its key, so an engine that maps one partition can never see another's bytes. Every partition
has room for ``num_pages`` pages, but together they hold at most ``num_pages`` *resident* pages (pages
whose memory exists): a partition made later (:class:`PartitionBacking`) is sparse, and a run it takes
first is fresh, made resident from the shared budget; when the budget is spent, free resident pages of
other partitions give their memory back first. So the tier's capacity is ``num_pages`` pages whichever
tenants use it, and memory stays bounded by it.

Fragmentation: the free pages of a partition are resident (used before) or fresh (no memory); a run is
taken from one kind. When neither holds a run long enough, the partition's own resident free pages give
their memory back, so that they merge with the fresh ones into longer runs; when even that fails, the
caller (the cache) evicts more chunks and tries again (their runs merge with the free ones around them).

Not thread-safe: the slot tier calls it under its own lock.

Primitives:
    PartitionBacking: how a tier makes a sparse partition and gives pages back.
    SlotSpace: take / give / rows / flat / free_pages / partition over the partitions.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch

from tiercache.errors import CapacityError
from tiercache.tiers.runs import FreeRuns

DEFAULT_PARTITION = ""
"""Key of the partition a tier is made with (chunks of namespaces assigned to no tenant)."""


class PartitionBacking(ABC):
    """Makes the memory of partitions after the first (a shared-memory tier: one segment per tenant)."""

    @abstractmethod
    def create(self, key: str, num_pages: int, page_bytes: int) -> torch.Tensor:
        """A new sparse ``[num_pages, page_bytes]`` ``uint8`` tensor for partition ``key`` (no memory yet)."""

    @abstractmethod
    def populate(self, key: str, start: int, count: int) -> None:
        """Fault in pages ``[start, start + count)`` about to be used for the first time (so writes run at
        memory speed)."""

    @abstractmethod
    def release(self, key: str, start: int, count: int) -> None:
        """Give the memory of free pages ``[start, start + count)`` back to the system (they read as zeros
        afterwards)."""


@dataclass(slots=True)
class _Partition:
    rows: torch.Tensor
    flat: torch.Tensor  # the same memory, 1-D
    free: FreeRuns  # resident free pages
    fresh: FreeRuns  # free pages without memory
    array: np.ndarray | None = None  # ``flat`` as an array (host memory only), made on first use


class SlotSpace:
    """The partitions of one slot tier."""

    def __init__(self, first: torch.Tensor, backing: PartitionBacking | None = None) -> None:
        """Args: first: the default partition (all pages resident); backing: makes further partitions (None:
        every key maps to the default partition)."""
        self.num_pages = int(first.shape[0])
        self.page_bytes = int(first.shape[1])
        self._backing = backing
        self._parts = {
            DEFAULT_PARTITION: _Partition(
                first, first.view(-1), FreeRuns(self.num_pages, True), FreeRuns(self.num_pages, False)
            )
        }
        self._budget = 0  # pages that may still become resident in some partition

    def partition(self, key: str) -> str:
        """The key a chunk of tenant ``key`` is stored under (the default one without a backing)."""
        return key if self._backing is not None else DEFAULT_PARTITION

    def rows(self, key: str) -> torch.Tensor:
        """The page tensor of a partition, making the partition when it does not exist yet."""
        return self._part(key).rows

    def flat(self, key: str) -> torch.Tensor:
        """A partition's memory as one 1-D tensor (a run of pages is a slice of it)."""
        return self._part(key).flat

    def array(self, key: str) -> np.ndarray:
        """A host partition's memory as one 1-D ``uint8`` array (the same memory as :meth:`flat`): a run of
        pages is a slice of it without a tensor op (a tenth of a microsecond, not one).

        Raises:
            TypeError: the partition is not in host memory.
        """
        part = self._part(key)
        if part.array is None:
            part.array = part.flat.numpy()
        return part.array

    def keys(self) -> list[str]:
        """Keys of the partitions made so far."""
        return list(self._parts)

    def free_pages(self) -> int:
        """Pages that takes can still get, in any partition (resident free pages plus the unspent budget);
        one take may find less in one run."""
        return self._budget + sum(p.free.total for p in self._parts.values())

    def take(self, key: str, count: int) -> int:
        """The first page of a free run of ``count`` pages of partition ``key``: resident pages, else fresh
        ones (from the budget, or from the memory other partitions' free pages give back).

        Raises:
            CapacityError: no run that long is free in the partition, or not enough pages are free anywhere.
        """
        part = self._part(key)
        start = part.free.take(count)
        if start is not None:
            return start
        if self._backing is None:
            raise CapacityError(
                f"no run of {count} free pages ({part.free.total} free, the longest run"
                f" {part.free.largest()})"
            )
        start = part.fresh.take(count)
        if start is None:
            self._release_free(key, part)  # merge this partition's resident free pages with its fresh ones
            start = part.fresh.take(count)
            if start is None:
                raise CapacityError(
                    f"partition {key!r}: no run of {count} free pages (longest {part.fresh.largest()})"
                )
        try:
            self._reclaim(key, count)
        except CapacityError:
            part.fresh.give(start, count)
            raise
        self._budget -= count
        self._backing.populate(key, start, count)
        return start

    def give(self, key: str, start: int, count: int) -> None:
        """A run of ``key`` is free again (its memory stays resident for the next takes of that partition)."""
        self._parts[key].free.give(start, count)

    def _part(self, key: str) -> _Partition:
        part = self._parts.get(key)
        if part is None:
            assert self._backing is not None and key != DEFAULT_PARTITION
            rows = self._backing.create(key, self.num_pages, self.page_bytes)
            part = self._parts[key] = _Partition(
                rows, rows.view(-1), FreeRuns(self.num_pages, False), FreeRuns(self.num_pages, True)
            )
        return part

    def _release_free(self, key: str, part: _Partition) -> None:
        """Give back the memory of every resident free page of one partition (they become fresh)."""
        assert self._backing is not None
        while (run := part.free.take_any(part.free.total)) is not None:
            self._backing.release(key, *run)
            part.fresh.give(*run)
            self._budget += run[1]

    def _reclaim(self, key: str, count: int) -> None:
        """Make the budget hold ``count`` pages: free resident pages of other partitions give their memory
        back, from the partitions with most free first; then those of partition ``key`` itself (pages in
        runs too short for the take)."""
        assert self._backing is not None
        while self._budget < count:
            donors = [(p.free.total, k) for k, p in self._parts.items() if k != key and p.free.total]
            if not donors and self._parts[key].free.total:
                donors = [(self._parts[key].free.total, key)]
            if not donors:
                raise CapacityError(
                    f"{count} pages wanted, {self._budget} free in all ({self.num_pages} pages in all)"
                )
            _, donor = max(donors)
            part = self._parts[donor]
            run = part.free.take_any(count - self._budget)
            assert run is not None
            self._backing.release(donor, *run)
            part.fresh.give(*run)
            self._budget += run[1]
