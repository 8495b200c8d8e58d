"""A slot tier hashes committed chunks outside its lock, and re-checks the reservation before committing."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator, Sequence

import pytest
import torch

from tiercache.errors import ConflictError
from tiercache.tiers.base import WriteSlot
from tiercache.tiers.host import HostTier, HostTierConfig

SLOT = 4096
DEADLINE_S = 30.0


class _PausedHashTier(HostTier):
    """An L2 tier whose commit stops after hashing, until the test lets it go (the race made certain)."""

    def __init__(self, config: HostTierConfig) -> None:
        super().__init__(config)
        self.hashed = threading.Event()
        self.go = threading.Event()

    def _checksums(
        self,
        slots: Sequence[WriteSlot],
        wheres: Sequence[tuple[str, int]],
        known: Sequence[int | None] | None,
    ) -> list[int | None]:
        checks = super()._checksums(slots, wheres, known)
        self.hashed.set()
        assert self.go.wait(DEADLINE_S)
        return checks


@pytest.fixture
def tier() -> Iterator[_PausedHashTier]:
    t = _PausedHashTier(
        HostTierConfig(
            capacity_bytes=4 * SLOT, slot_bytes=SLOT, segment_prefix=f"tc-hash-{secrets.token_hex(3)}"
        )
    )
    yield t
    t.go.set()
    t.close()


def _commit_in_thread(tier: HostTier, ws: WriteSlot) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            tier.commit([ws])
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors


def test_a_slot_aborted_while_hashed_is_not_committed(tier: _PausedHashTier) -> None:
    cid = b"c" * 48
    (ws,) = tier.reserve([cid], [SLOT])
    ws.buffer.fill_(3)
    thread, errors = _commit_in_thread(tier, ws)
    assert tier.hashed.wait(DEADLINE_S)
    tier.abort([ws])  # the lock is free while the commit hashes
    tier.go.set()
    thread.join(DEADLINE_S)
    assert not thread.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], ConflictError)
    assert tier.contains([cid]) == [False]
    assert tier.usage().reserved_bytes == 0 and tier.usage().free_bytes == 4 * SLOT
    (again,) = tier.reserve([cid], [SLOT])  # the aborted slot is free for the next writer
    again.buffer.fill_(4)
    tier.go.set()
    tier.commit([again])
    got = torch.empty(SLOT, dtype=torch.uint8)
    assert tier.read_into([cid], [got]) == [True] and bool((got == 4).all())


def test_reads_and_reserves_go_on_while_a_commit_hashes(tier: _PausedHashTier) -> None:
    old, new = b"o" * 48, b"n" * 48
    tier.go.set()
    (ws,) = tier.reserve([old], [SLOT])
    ws.buffer.fill_(9)
    tier.commit([ws])
    tier.go.clear()
    tier.hashed.clear()
    (ws,) = tier.reserve([new], [SLOT])
    ws.buffer.fill_(5)
    thread, errors = _commit_in_thread(tier, ws)
    assert tier.hashed.wait(DEADLINE_S)
    got = torch.empty(SLOT, dtype=torch.uint8)
    seen: list[object] = []

    def meanwhile() -> None:  # every call takes the tier's lock: a commit hashing under it would stall them
        seen.append(tier.read_into([old], [got]))
        (other,) = tier.reserve([b"x" * 48], [SLOT])
        tier.abort([other])
        seen.append(tier.contains([new]))

    other_thread = threading.Thread(target=meanwhile)
    other_thread.start()
    other_thread.join(DEADLINE_S)
    assert not other_thread.is_alive(), "the tier's lock was held while a commit hashed"
    assert seen == [[True], [False]] and bool((got == 9).all())  # the new chunk is not visible yet
    tier.go.set()
    thread.join(DEADLINE_S)
    assert not thread.is_alive() and errors == []
    assert tier.read_into([new], [got]) == [True] and bool((got == 5).all())
    assert tier.verify(new)


def test_a_slot_given_twice_in_one_commit_is_refused(tier: _PausedHashTier) -> None:
    tier.go.set()
    (ws,) = tier.reserve([b"d" * 48], [SLOT])
    with pytest.raises(ConflictError):
        tier.commit([ws, ws])
    tier.commit([ws])
    assert tier.contains([b"d" * 48]) == [True]
