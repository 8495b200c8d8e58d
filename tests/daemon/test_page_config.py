"""The daemon's ``page_bytes`` option: it reaches the L1 and L2 configs, and a bad value names the option."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiercache.daemon.config import ConfigError
from tiercache.daemon.options import load_config


def _env(tmp_path: Path) -> dict[str, str]:
    return {"HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "c"), "XDG_RUNTIME_DIR": str(tmp_path)}


def test_page_bytes_reaches_l1_and_l2(tmp_path: Path) -> None:
    argv = [
        "--l1-device",
        "cpu",
        "--l1-bytes",
        "1M",
        "--l2-bytes",
        "2M",
        "--slot-bytes",
        "256K",
        "--l3-path",
        "",
    ]
    tiers = load_config([*argv, "--page-bytes", "16K"], _env(tmp_path)).tiers
    assert tiers.l1 is not None and tiers.l1.page_size == 16 << 10 and tiers.l2.page_size == 16 << 10
    default = load_config(argv, _env(tmp_path)).tiers
    assert default.l2.page_size == 64 << 10 and default.l1 is not None and default.l1.page_size == 64 << 10
    for slot, page in (("32K", 32 << 10), ("96K", 96 << 10), ("192K", 64 << 10)):
        sized = [slot if a == "256K" else a for a in argv]
        assert load_config(sized, _env(tmp_path)).tiers.l2.page_size == page  # 64K only where it divides
    whole = load_config([*argv, "--page-bytes", "0"], _env(tmp_path)).tiers
    assert whole.l2.page_bytes == 0 and whole.l2.page_size == 256 << 10  # 0: one page per chunk
    env = {**_env(tmp_path), "TIERCACHE_PAGE_BYTES": "64K"}
    assert load_config(argv, env).tiers.l2.page_size == 64 << 10


@pytest.mark.parametrize("value", ["512K", "-4K"])
def test_a_page_larger_than_a_slot_or_negative_is_refused(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError, match="--page-bytes"):
        load_config(
            ["--l2-bytes", "2M", "--slot-bytes", "256K", "--l3-path", "", f"--page-bytes={value}"],
            _env(tmp_path),
        )
