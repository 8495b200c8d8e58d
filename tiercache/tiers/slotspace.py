"""Where the slots of a slot tier live: partitions of rows that share one budget of resident slots.

A slot tier's memory is one or more *partitions*, each a 2-D ``uint8`` tensor ``[num_slots, slot_bytes]``
named by a key (the tenant whose chunks it holds; ``""`` is the default partition, given at construction).
A partition is a hard wall: its rows are only ever handed to chunks of its key, so an engine that maps one
partition can never see another's bytes. Every partition has room for ``num_slots`` rows, but together they
hold at most ``num_slots`` *resident* rows (rows whose pages exist): a partition made later
(:class:`PartitionBacking`) is sparse, and a row it takes first is a fresh one made resident from the shared
budget; when the budget is spent, a free resident row of another partition gives its pages back first.
So the tier's capacity is ``num_slots`` slots whichever tenants use it, and memory stays bounded by it.

Not thread-safe: the slot tier calls it under its own lock.

Primitives:
    PartitionBacking: how a tier makes a sparse partition and gives a row's pages back.
    SlotSpace: take / give / row / free_slots / partition over the partitions.
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from tiercache.errors import CapacityError

DEFAULT_PARTITION = ""
"""Key of the partition a tier is made with (chunks of namespaces assigned to no tenant)."""


class PartitionBacking(ABC):
    """Makes the memory of partitions after the first (a shared-memory tier: one segment per tenant)."""

    @abstractmethod
    def create(self, key: str, num_slots: int, slot_bytes: int) -> torch.Tensor:
        """A new sparse ``[num_slots, slot_bytes]`` ``uint8`` tensor for partition ``key`` (no pages yet)."""

    @abstractmethod
    def populate(self, key: str, row: int) -> None:
        """Fault in the pages of a row about to be used for the first time (so writes run at memory speed)."""

    @abstractmethod
    def release(self, key: str, row: int) -> None:
        """Give a free row's pages back to the system (its bytes read as zeros afterwards)."""


@dataclass(slots=True)
class _Partition:
    rows: torch.Tensor
    free: list[int]  # heap of resident free rows
    fresh: list[int] = field(default_factory=list)  # heap of rows without pages


class SlotSpace:
    """The partitions of one slot tier."""

    def __init__(self, first: torch.Tensor, backing: PartitionBacking | None = None) -> None:
        """Args: first: the default partition (all rows resident); backing: makes further partitions (None:
        every key maps to the default partition)."""
        self.num_slots = int(first.shape[0])
        self.slot_bytes = int(first.shape[1])
        self._backing = backing
        self._parts = {DEFAULT_PARTITION: _Partition(first, list(range(self.num_slots)))}
        self._budget = 0  # rows that may still become resident in some partition

    def partition(self, key: str) -> str:
        """The key a chunk of tenant ``key`` is stored under (the default one without a backing)."""
        return key if self._backing is not None else DEFAULT_PARTITION

    def rows(self, key: str) -> torch.Tensor:
        """The row tensor of a partition, making the partition when it does not exist yet."""
        return self._part(key).rows

    def keys(self) -> list[str]:
        """Keys of the partitions made so far."""
        return list(self._parts)

    def free_slots(self) -> int:
        """Rows that a take can still get, in any partition (resident free rows plus the unspent budget)."""
        return self._budget + sum(len(p.free) for p in self._parts.values())

    def take(self, key: str) -> int:
        """A free row of partition ``key``: a resident one, else a fresh one (from the budget, or from the pages
        another partition's free row gives back).

        Raises:
            CapacityError: no row is free anywhere.
        """
        part = self._part(key)
        if part.free:
            return heapq.heappop(part.free)
        if self._budget == 0:
            self._reclaim_one(key)
        self._budget -= 1
        row = heapq.heappop(part.fresh)
        assert self._backing is not None  # fresh rows only exist in partitions a backing made
        self._backing.populate(key, row)
        return row

    def give(self, key: str, row: int) -> None:
        """A row of ``key`` is free again (its pages stay resident for the next take of that partition)."""
        heapq.heappush(self._parts[key].free, row)

    def _part(self, key: str) -> _Partition:
        part = self._parts.get(key)
        if part is None:
            assert self._backing is not None and key != DEFAULT_PARTITION
            rows = self._backing.create(key, self.num_slots, self.slot_bytes)
            part = self._parts[key] = _Partition(rows, [], list(range(self.num_slots)))
        return part

    def _reclaim_one(self, key: str) -> None:
        """Give back the pages of one free resident row of another partition (the one with most free)."""
        donors = [(len(p.free), k) for k, p in self._parts.items() if k != key and p.free]
        if not donors:
            raise CapacityError(f"no free slot left in any partition ({self.num_slots} slots in all)")
        _, donor = max(donors)
        part = self._parts[donor]
        row = heapq.heappop(part.free)
        if self._backing is not None:
            self._backing.release(donor, row)
        heapq.heappush(part.fresh, row)
        self._budget += 1
