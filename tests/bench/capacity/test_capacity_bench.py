"""Tests of ``tiercache-bench capacity``: a small run over a real L2 tier, its JSON and chart, the refusal of
bad configs, and the end-of-run check that catches a chunk whose bytes changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tiercache.bench.capacity.run import MIB, CapacityConfig, SizeMix, _Filler
from tiercache.bench.cli import main
from tiercache.bench.common.tier_ops import RoundTripError
from tiercache.tiers.host import HostTier, HostTierConfig


def test_small_run_fills_with_pages_far_better_than_one_page_per_slot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")  # --plot
    out, png = tmp_path / "c.json", tmp_path / "c.png"
    argv = ["capacity", "--capacity", "64M", "--slot-bytes", "8M", "--churn", "50",
            "--json", str(out), "--plot", str(png), "-q"]  # fmt: skip
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == "tiercache-bench/capacity/1" and png.stat().st_size > 0
    rows = doc["rows"]
    # the mixes that fit 8 MiB slots (2-8 MiB, 64 KiB-1 MiB), each under 64 KiB pages and one page per slot
    assert [(r["mix"]["name"], r["page_bytes"]) for r in rows] == [
        ("2-8 MiB", 64 << 10), ("2-8 MiB", 8 * MIB), ("64 KiB-1 MiB", 64 << 10), ("64 KiB-1 MiB", 8 * MIB)
    ]  # fmt: skip
    for paged, whole in zip(rows[::2], rows[1::2], strict=True):
        assert paged["target"] == 0.9 and whole["target"] is None and whole["met"] is None
        assert 0 < whole["full_utilisation"] < paged["full_utilisation"] <= 1
        assert paged["full_chunks"] > whole["full_chunks"] == 8  # one chunk per slot
        assert paged["churned"] == whole["churned"] == 50
        assert 0 < paged["churn_low"] <= paged["churn_median"] <= paged["churn_high"] <= 1
    assert doc["met"] == all(r["met"] is not False for r in rows)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"capacity_bytes": MIB, "slot_bytes": 2 * MIB}, "at least one slot"),
        ({"page_sizes": (4 * MIB,), "slot_bytes": 2 * MIB, "mixes": (SizeMix("s", 1, 2),)}, "page sizes"),
        ({"mixes": (SizeMix("big", MIB, 64 * MIB),)}, "low <= high"),
        ({"churn_chunks": -1}, "churn"),
    ],
)
def test_bad_config_is_refused(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        CapacityConfig(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("flag", [["--page-sizes", "64Q"], ["--churn", "-1"]])
def test_bad_flag_is_a_usage_error_naming_it(flag: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["capacity", *flag, "-q"])
    assert exc.value.code == 2
    assert f"argument {flag[0]}" in capsys.readouterr().err


def test_the_end_check_finds_a_chunk_whose_bytes_changed() -> None:
    tier = HostTier(
        HostTierConfig(8 * MIB, MIB, segment_prefix="tc-test-capacity", pin=False, page_bytes=64 << 10)
    )
    try:
        filler = _Filler(tier)
        for size in (100_000, 300_000, 70_000):
            assert filler.store(size, evict=False)
        filler.check()  # untouched: passes
        view = tier.view(filler.held[1])
        assert view is not None
        view[7] ^= 0xFF
        with pytest.raises(RoundTripError, match="1 of 3"):
            filler.check()
    finally:
        tier.close()
