"""The ``tiercache-bench`` registry: every benchmark is a subpackage of one shape (a command module with
``configure_parser`` and ``run``, a run module, a report module), and ``--help`` lists every subcommand in
the registry's order."""

from __future__ import annotations

import argparse
import importlib

import pytest

from tiercache.bench.cli import COMMANDS, Command, main

HARNESS_ENTRIES = ("faults", "soak")  # thin entries over the test machinery, not benchmark subpackages


def test_help_lists_every_subcommand_in_registry_order(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    positions = [out.index(f"\n    {c.name}") for c in COMMANDS]
    assert positions == sorted(positions)
    assert [c.name for c in COMMANDS] == [
        "tiers", "connector", "workload", "compare", "concurrency", "scale", "capacity", "layerwise",
        "singleflight", "engine", "fleet", "faults", "soak", "vllm", "serve", "sglang",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "command", [c for c in COMMANDS if c.name not in HARNESS_ENTRIES], ids=lambda c: c.name
)
def test_every_benchmark_has_a_command_a_run_and_a_report(command: Command) -> None:
    module_path = command.module
    package, leaf = module_path.lstrip(".").split(".")
    assert leaf == "command"
    for part in ("run", "report"):
        importlib.import_module(f"tiercache.bench.{package}.{part}")
    module = importlib.import_module(f"tiercache.bench.{package}.command")
    description = (module.__doc__ or "").split("\n\n")[0]
    assert description.startswith(f"``tiercache-bench {command.name}``") or description.startswith(
        f"``{command.name}``"
    )
    parser = argparse.ArgumentParser()
    module.configure_parser(parser)
    assert callable(module.run)
