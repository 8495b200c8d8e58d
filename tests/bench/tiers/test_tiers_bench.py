"""Tests of ``tiercache-bench tiers``: a tiny real run, its JSON, round-trip verification and the CLI."""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from tiercache.bench.args import parse_size, parse_sizes
from tiercache.bench.ceilings import CeilingKind, CeilingResult
from tiercache.bench.cli import main
from tiercache.bench.common.payload import make_payload
from tiercache.bench.common.tier_ops import Op, RoundTripError, TierOpResult, verify_round_trip
from tiercache.bench.common.timing import Timing
from tiercache.bench.tiers.checksum_ceiling import ChecksumMethod, copy_crc32c
from tiercache.bench.tiers.targets import compare
from tiercache.tiers.base import TierLevel
from tiercache.tiers.slots import SlotPoolTier

REPO_ROOT = Path(__file__).resolve().parents[3]
TIERS = ("L1", "L2", "L3")
OPS = ("put", "get")
SIZES = (256 << 10, 1 << 20)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One tiny real run of all three tiers; returns its JSON document (and checks the work dir is gone)."""
    work = tmp_path_factory.mktemp("bench-work")
    json_path = tmp_path_factory.mktemp("bench-out") / "tiers.json"
    argv = [
        "tiers",
        "--chunk-sizes",
        "256K,1M",
        "--bytes-per-size",
        "4M",
        "--dir",
        str(work),
        "--json",
        str(json_path),
    ]
    assert main([*argv, "--quiet"]) == 0
    assert list(work.iterdir()) == [], "the work directory (L3, disk ceiling) must be removed"
    doc: dict[str, Any] = json.loads(json_path.read_text())
    return doc


def test_json_has_every_tier_op_and_size(tiny_run: dict[str, Any]) -> None:
    got = {(r["tier"], r["op"], r["chunk_bytes"]) for r in tiny_run["results"]}
    assert got == {(t, o, s) for t in TIERS for o in OPS for s in SIZES}
    assert len(tiny_run["results"]) == len(got)
    assert tiny_run["config"]["chunk_sizes"] == list(SIZES)
    assert tiny_run["config"]["tiers"] == list(TIERS)
    for key in ("cpu_count", "platform", "python", "torch", "device", "filesystem"):
        assert tiny_run["machine"][key]


def test_json_figures_are_self_consistent(tiny_run: dict[str, Any]) -> None:
    ceilings = {(c["label"], c["chunk_bytes"]): c for c in tiny_run["ceilings"]}
    kinds = {(c["kind"], c["chunk_bytes"]) for c in tiny_run["ceilings"]}
    assert kinds == {(k, s) for k in ("memcpy", "disk_write", "disk_read", "lmdb_get") for s in SIZES}
    rounds = tiny_run["config"]["rounds"]
    assert rounds == 3
    for item in [*tiny_run["ceilings"], *tiny_run["results"]]:
        assert item["gbps"] > 0
        assert item["p99_ms"] >= item["p50_ms"] > 0
        assert item["calls"] >= 1
        assert math.isclose(item["gbps"], item["total_bytes"] / item["seconds"] / 1e9, rel_tol=1e-9)
        # the reported round is the median one (the lower middle of an even count)
        assert len(item["round_gbps"]) == rounds
        assert item["gbps"] == sorted(item["round_gbps"])[(rounds - 1) // 2]
    for r in tiny_run["results"]:
        assert r["total_bytes"] == 4 << 20
        assert r["verified_bytes"] == r["total_bytes"]
        assert r["comparisons"], f"{r['tier']} {r['op']} is compared with no ceiling"
        for c in r["comparisons"]:
            ceiling = ceilings[(c["ceiling"], r["chunk_bytes"])]
            assert math.isclose(c["ceiling_gbps"], ceiling["gbps"], rel_tol=1e-12)
            # each round's figure is divided by the ceiling of the same round; the median ratio is kept
            expected = [g / cg for g, cg in zip(r["round_gbps"], ceiling["round_gbps"], strict=True)]
            assert c["round_ratios"] == pytest.approx(expected, rel=1e-9)
            assert math.isclose(c["ratio"], statistics.median(expected), rel_tol=1e-9)
            assert (c["low"], c["high"]) == pytest.approx((min(expected), max(expected)), rel=1e-9)
            if c["target"] is None:
                assert c["met"] is None
            else:
                assert c["met"] == (c["ratio"] >= c["target"])
    l3_get = [r for r in tiny_run["results"] if (r["tier"], r["op"]) == ("L3", "get")]
    expected_l3 = {"lmdb_get(lmdb)", "memcpy(cpu)", "disk_read"}
    assert all({c["ceiling"] for c in r["comparisons"]} == expected_l3 for r in l3_get)


def test_targets_follow_the_issue(tiny_run: dict[str, Any]) -> None:
    targets = {
        (r["tier"], r["op"], r["chunk_bytes"], c["ceiling"]): c["target"]
        for r in tiny_run["results"]
        for c in r["comparisons"]
    }
    assert targets[("L2", "put", 1 << 20, "memcpy(cpu)")] == 0.8
    assert targets[("L2", "get", 1 << 20, "memcpy(cpu)")] == 0.8
    assert targets[("L2", "put", 256 << 10, "memcpy(cpu)")] is None  # only for chunks >= 1 MiB
    assert targets[("L3", "put", 256 << 10, "disk_write")] == 0.7
    assert targets[("L3", "get", 256 << 10, "lmdb_get(lmdb)")] == 0.9  # memcpy is out of a file map's reach
    assert targets[("L3", "get", 256 << 10, "memcpy(cpu)")] is None
    assert targets[("L3", "get", 256 << 10, "disk_read")] is None


def test_the_checksum_table_has_every_method_at_every_size(tiny_run: dict[str, Any]) -> None:
    # the dev extra installs crc32c, so the alternative checksum is measured beside xxh3
    rows = tiny_run["checksums"]
    for size in SIZES:
        methods = [r["method"] for r in rows if r["chunk_bytes"] == size]
        assert methods == [m.value for m in ChecksumMethod], size
        memcpy = next(r for r in rows if r["chunk_bytes"] == size and r["method"] == "memcpy")
        assert memcpy["ratio"] == 1.0
        assert all(r["gbps"] > 0 and r["low"] <= r["ratio"] <= r["high"] for r in rows)
    assert sum(r["in_use"] for r in rows) == len(SIZES)


@pytest.mark.parametrize("block", [1, 7, 4096])
def test_the_blocked_crc32c_pass_copies_exactly_and_equals_one_shot_crc32c(block: int) -> None:
    crc32c = pytest.importorskip("crc32c")
    src = bytes(range(256)) * 41 + b"tail"
    dst = bytearray(len(src) + 3)
    value = copy_crc32c(memoryview(dst), memoryview(src), block, crc32c.crc32c)
    assert value == crc32c.crc32c(src)
    assert bytes(dst[: len(src)]) == src and dst[len(src) :] == b"\0\0\0"
    flipped = bytearray(src)
    flipped[-1] ^= 1
    assert copy_crc32c(memoryview(dst), memoryview(bytes(flipped)), block, crc32c.crc32c) != value


def test_verify_round_trip_counts_equal_bytes() -> None:
    payload = make_payload(4096, 3, seed=1)
    copies = [c.clone() for c in payload.chunks()]
    assert verify_round_trip(payload.chunks(), copies) == 3 * 4096


def test_verify_round_trip_reports_one_flipped_byte() -> None:
    payload = make_payload(4096, 3, seed=1)
    copies = [c.clone() for c in payload.chunks()]
    copies[2][1234] ^= 0x01
    with pytest.raises(RoundTripError, match=r"chunk 2 .* first at byte 1234"):
        verify_round_trip(payload.chunks(), copies)


def test_verify_round_trip_reports_missing_and_short_chunks() -> None:
    payload = make_payload(4096, 2, seed=1)
    with pytest.raises(RoundTripError):
        verify_round_trip(payload.chunks(), [payload.chunks()[0]])
    with pytest.raises(RoundTripError, match="read back 100 bytes"):
        verify_round_trip(payload.chunks(), [payload.chunks()[0], torch.zeros(100, dtype=torch.uint8)])


def test_payload_is_bf16_kv_like_and_seeded() -> None:
    a, b = make_payload(1 << 12, 2, seed=7), make_payload(1 << 12, 2, seed=7)
    assert torch.equal(a.data, b.data)
    values = a.data.view(torch.bfloat16).float()
    assert torch.isfinite(values).all() and 0.5 < values.std().item() < 1.5


def test_parse_sizes() -> None:
    assert parse_sizes("256K,1M,4MiB,32m") == (256 << 10, 1 << 20, 4 << 20, 32 << 20)
    assert parse_size("1048576") == 1 << 20
    assert parse_size("1.5K") == 1536


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    bad = (["tiers", "--tiers", "L4"], ["tiers", "--chunk-sizes", "12Q"], ["tiers", "--codec", "lz4"],
           ["tiers", "--rounds", "0"])  # fmt: skip
    for argv in bad:
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
    assert "valid: L1,L2,L3" in capsys.readouterr().err


def test_python_m_help_runs() -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *(p for p in sys.path if p)])
    for argv in (["--help"], ["tiers", "--help"]):
        out = subprocess.run(
            [sys.executable, "-m", "tiercache.bench", *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert out.returncode == 0, out.stderr
        assert "tiercache-bench" in out.stdout
    assert "--chunk-sizes" in out.stdout


def _tiny_argv(tmp_path: Path) -> list[str]:
    return [
        "tiers",
        "--tiers",
        "L2",
        "--chunk-sizes",
        "256K",
        "--bytes-per-size",
        "1M",
        "--dir",
        str(tmp_path),
        "-q",
    ]


def test_corrupt_read_back_fails_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = SlotPoolTier.read_into

    def corrupting(
        self: SlotPoolTier, chunk_ids: Sequence[bytes], dsts: Sequence[torch.Tensor]
    ) -> list[bool]:
        found = real(self, chunk_ids, dsts)
        dsts[-1][7] ^= 0xFF
        return found

    monkeypatch.setattr(SlotPoolTier, "read_into", corrupting)
    json_path = tmp_path / "out.json"
    assert main([*_tiny_argv(tmp_path), "--json", str(json_path)]) == 1
    captured = capsys.readouterr()
    assert "round trip FAILED" in captured.err and "first at byte 7" in captured.err
    assert captured.out == "" and not json_path.exists(), "a failed round trip must not produce figures"


def test_missing_chunk_fails_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def missing(self: SlotPoolTier, chunk_ids: Sequence[bytes], dsts: Sequence[torch.Tensor]) -> list[bool]:
        return [False] * len(chunk_ids)

    monkeypatch.setattr(SlotPoolTier, "read_into", missing)
    assert main(_tiny_argv(tmp_path)) == 1
    assert "were not found" in capsys.readouterr().err


def _timing(gbps: float) -> Timing:
    return Timing(total_bytes=10**9, calls=1, seconds=1 / gbps, p50_s=1 / gbps, p99_s=1 / gbps)


def test_one_glitched_ceiling_round_does_not_decide_the_ratio() -> None:
    chunk = 1 << 20
    rounds = [TierOpResult(TierLevel.L2, Op.PUT, "cpu", chunk, _timing(1.0), chunk) for _ in range(3)]
    ceilings = [[CeilingResult(CeilingKind.MEMCPY, "cpu", chunk, _timing(g))] for g in (2.0, 0.1, 2.5)]
    (c,) = compare(rounds, ceilings)
    assert c.round_ratios == pytest.approx((0.5, 10.0, 0.4))
    assert c.ratio == pytest.approx(0.5) and (c.low, c.high) == pytest.approx((0.4, 10.0))
    assert c.ceiling_gbps == pytest.approx(2.0)  # the median ceiling round, not the glitch
    assert c.target == 0.8 and c.met is False
    with pytest.raises(ValueError, match="one ceiling set per round"):
        compare(rounds, ceilings[:2])
