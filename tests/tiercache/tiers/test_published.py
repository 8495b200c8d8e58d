"""The L2 index a pool publishes in its segment: written by the daemon's tier, read by engines with no call."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator

import pytest

from tiercache.errors import InvalidArgumentError
from tiercache.keys import chunk_id
from tiercache.shm import SharedSegment
from tiercache.tiers.host import HostTier, HostTierConfig
from tiercache.tiers.published import (
    ENTRY_BYTES,
    HEADER_BYTES,
    MAX_PROBES,
    STALE_S,
    IndexReader,
    IndexWriter,
    Published,
    index_bytes,
)

SLOT = 4096
NS_A, NS_B = b"a" * 16, b"b" * 16


def _key(i: int) -> bytes:
    return i.to_bytes(4, "little") + secrets.token_bytes(28)


def _table(entries: int = 32) -> tuple[IndexWriter, IndexReader]:
    buffer = memoryview(bytearray(index_bytes(entries)))
    return IndexWriter(buffer, entries), IndexReader(buffer, entries, num_pages=64, page_bytes=SLOT)


def test_a_published_chunk_is_found_where_it_is_and_a_withdrawn_one_is_not() -> None:
    writer, reader = _table()
    key = _key(1)
    assert reader.find(key, SLOT) is None
    assert writer.publish(key, slot=7, nbytes=SLOT)
    found = reader.find(key, SLOT)
    assert found is not None and (found.slot, found.nbytes) == (7, SLOT) and reader.still(found)
    assert writer.withdraw(key) and not writer.withdraw(key)
    assert reader.find(key, SLOT) is None
    assert not reader.still(found)  # the copy made from it does not count


def test_a_republished_chunk_invalidates_what_was_found_before() -> None:
    writer, reader = _table()
    key = _key(2)
    writer.publish(key, 3, SLOT)
    before = reader.find(key, SLOT)
    writer.publish(key, 9, SLOT)  # moved (e.g. dropped and promoted again)
    after = reader.find(key, SLOT)
    assert before is not None and after is not None and after.slot == 9
    assert not reader.still(before) and reader.still(after)


def test_probing_goes_on_past_withdrawn_entries_and_stops_at_the_bound() -> None:
    writer, reader = _table(entries=16)
    same_home = [i.to_bytes(8, "little") * 4 for i in (5, 21, 37, 53)]  # all home at 5 of 16
    for n, key in enumerate(same_home):
        assert writer.publish(key, n, SLOT)
    writer.withdraw(same_home[0])
    assert [reader.find(k, SLOT) is not None for k in same_home] == [False, True, True, True]
    crowded = [(5 + 16 * i).to_bytes(8, "little") * 4 for i in range(4, 4 + MAX_PROBES)]
    published = [writer.publish(k, 1, SLOT) for k in crowded]
    assert published.count(True) == MAX_PROBES - 3  # the places left within the bound
    assert writer.live == MAX_PROBES


def test_prefix_stops_at_the_first_chunk_not_published() -> None:
    writer, reader = _table()
    keys = [_key(i) for i in range(4)]
    for i in (0, 1, 3):
        writer.publish(keys[i], i, SLOT)
    assert [p.slot for p in reader.prefix(keys, SLOT)] == [0, 1]


def test_garbled_and_half_written_entries_read_as_misses() -> None:
    entries = 32
    buffer = memoryview(bytearray(index_bytes(entries)))
    writer, reader = IndexWriter(buffer, entries), IndexReader(buffer, entries, num_pages=4, page_bytes=SLOT)
    out_of_range, wrong_size, torn = _key(1), _key(2), _key(3)
    writer.publish(out_of_range, 4, SLOT)  # past the pool's 4 pages
    writer.publish(wrong_size, 0, SLOT // 2)
    writer.publish(torn, 1, SLOT)
    assert reader.find(out_of_range, SLOT) is None and reader.find(wrong_size, SLOT) is None
    found = reader.find(torn, SLOT)
    assert isinstance(found, Published)
    buffer[HEADER_BYTES + found.place * ENTRY_BYTES] += 1  # odd: the daemon is writing the entry
    assert reader.find(torn, SLOT) is None and not reader.still(found)


def test_an_index_the_daemon_stopped_beating_or_closed_is_not_read() -> None:
    buffer = memoryview(bytearray(index_bytes(32)))
    writer = IndexWriter(buffer, 32)
    now = [0]
    reader = IndexReader(buffer, 32, num_pages=64, page_bytes=SLOT, clock=lambda: now[0])
    key = _key(1)
    writer.publish(key, 2, SLOT)
    beat = int.from_bytes(buffer[:8], "little")
    now[0] = beat + int(STALE_S * 1e9) - 1
    assert [p.slot for p in reader.prefix([key], SLOT)] == [2]
    now[0] = beat + int(STALE_S * 1e9) + 1  # a daemon killed (or hung) beats no more
    assert reader.prefix([key], SLOT) == []
    writer.beat()
    now[0] = int.from_bytes(buffer[:8], "little")
    assert len(reader.prefix([key], SLOT)) == 1
    writer.close()
    assert not reader.alive() and reader.prefix([key], SLOT) == []


def test_tables_that_do_not_fit_their_buffer_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="index_entries"):
        IndexWriter(memoryview(bytearray(index_bytes(2) - 1)), 2)


@pytest.fixture
def tier() -> Iterator[HostTier]:
    t = HostTier(
        HostTierConfig(
            capacity_bytes=4 * SLOT, slot_bytes=SLOT, segment_prefix=f"tc-pub-{secrets.token_hex(3)}"
        )
    )
    t.assign(NS_B, "team-b")
    yield t
    t.close()


def _reader(tier: HostTier, segment: SharedSegment) -> IndexReader:
    view = SharedSegment.attach(segment.name) if not segment.name.startswith("memfd:") else segment
    pool = tier.num_pages * tier.page_bytes
    return IndexReader(view.buffer[pool:], tier.index_entries, tier.num_pages, tier.page_bytes)


def test_the_l2_tier_beats_while_open(tier: HostTier) -> None:
    reader = _reader(tier, tier.segment_of("team-b"))
    first = int.from_bytes(tier.segment_of("team-b").buffer[tier.num_pages * tier.page_bytes :][:8], "little")
    assert reader.alive()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the beat moves on (0.1 s apart; bounded for a loaded host)
        beat = int.from_bytes(
            tier.segment_of("team-b").buffer[tier.num_pages * tier.page_bytes :][:8], "little"
        )
        if beat > first:
            break
        time.sleep(0.05)
    assert beat > first


def test_the_l2_tier_publishes_commits_and_withdraws_a_chunk_before_its_pages_are_reused(
    tier: HostTier,
) -> None:
    reader = _reader(tier, tier.segment_of(""))
    key = _key(1)
    (ws,) = tier.reserve([chunk_id(NS_A, key)], [SLOT])
    ws.buffer.fill_(7)
    assert reader.find(key, SLOT) is None  # reserved: invisible until committed
    tier.commit([ws])
    found = reader.find(key, SLOT)
    assert found is not None and found.slot == tier.slot_of(chunk_id(NS_A, key))
    tier.delete([chunk_id(NS_A, key)])
    assert reader.find(key, SLOT) is None and not reader.still(found)


def test_each_tenant_pool_publishes_only_its_own_chunks(tier: HostTier) -> None:
    mine, theirs = _key(1), _key(2)
    for ns, key in ((NS_A, mine), (NS_B, theirs)):
        (ws,) = tier.reserve([chunk_id(ns, key)], [SLOT])
        tier.commit([ws])
    default, team_b = _reader(tier, tier.segment_of("")), _reader(tier, tier.segment_of("team-b"))
    assert default.find(mine, SLOT) is not None and default.find(theirs, SLOT) is None
    assert team_b.find(theirs, SLOT) is not None and team_b.find(mine, SLOT) is None


def test_a_closed_tier_withdraws_everything(tier: HostTier) -> None:
    reader = _reader(tier, tier.segment_of(""))
    key = _key(3)
    (ws,) = tier.reserve([chunk_id(NS_A, key)], [SLOT])
    tier.commit([ws])
    tier.close()
    assert reader.find(key, SLOT) is None
