"""Rules of the house: the direction of imports, module size, and a wheel that holds every module.

* Dependency direction (DESIGN.md "Layout"), read from the source with ``ast`` (relative imports resolved,
  imports inside functions and ``TYPE_CHECKING`` blocks included): the core — everything under
  ``tiercache/`` but ``tiercache.daemon``, ``tiercache.connector``, ``tiercache.testing`` and
  ``tiercache.bench`` — imports none of those four; the connector never imports the daemon and the daemon
  never imports the connector; neither imports ``tiercache.testing`` or ``tiercache.bench``, and
  ``tiercache.testing`` (which may use the daemon and the connector) never imports ``tiercache.bench``;
  nothing imports a bare top-level ``daemon``, ``proto``, ``bench`` or ``connector``.
* No hand-written module over :data:`MAX_MODULE_LINES` lines (the generated stubs aside).
* The wheel built from the checkout holds every module under ``tiercache/``, the stubs' ``.pyi`` and
  ``py.typed``, and each module imports from it in a process that cannot see the checkout.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "tiercache"
BENCH_TRACES = REPO / "bench" / "traces"
EDGE_PACKAGES = ("tiercache.daemon", "tiercache.connector", "tiercache.testing", "tiercache.bench")
"""Packages that sit on the core; everything else under ``tiercache`` is the core."""
BARE_NAMES = ("daemon", "proto", "bench", "connector")
"""Top-level import names that would collide with PyPI packages: everything is ``tiercache.*``."""
GENERATED = ("tiercache/proto/tiercache_pb2.py", "tiercache/proto/tiercache_pb2_grpc.py")
MAX_MODULE_LINES = 500


def module_name(path: Path) -> str:
    """``tiercache/tiers/lmdb.py`` -> ``tiercache.tiers.lmdb``; a package's ``__init__`` is the package."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_modules() -> list[Path]:
    """Every ``.py`` file under ``tiercache/`` in the checkout."""
    return sorted(PACKAGE.rglob("*.py"))


@dataclass(frozen=True, slots=True)
class Import:
    """One imported module name and where the import statement is."""

    module: str
    target: str
    line: int

    def where(self) -> str:
        return f"{self.module} (line {self.line}) imports {self.target}"


def imports_of(path: Path) -> Iterator[Import]:
    """The absolute module names a file imports (``from a import b`` yields ``a`` and ``a.b``)."""
    module = module_name(path)
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                drop = node.level - 1 if is_package else node.level
                base = base[: len(base) - drop] if drop else base
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield Import(module, target, node.lineno)
            for alias in node.names:
                if alias.name != "*":
                    yield Import(module, f"{target}.{alias.name}", node.lineno)


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def all_imports() -> list[Import]:
    return [imp for path in source_modules() for imp in imports_of(path)]


def test_relative_imports_are_resolved() -> None:
    """The resolver itself: a relative import in a module and in a package ``__init__``."""
    options = PACKAGE / "daemon" / "options.py"
    assert "tiercache.daemon.config" in {i.target for i in imports_of(options)}
    init = PACKAGE / "connector" / "__init__.py"
    assert "tiercache.connector.channel.ChannelConfig" in {i.target for i in imports_of(init)}


def test_the_core_imports_no_daemon_connector_testing_or_bench() -> None:
    bad = [
        imp.where()
        for imp in all_imports()
        if not any(within(imp.module, p) for p in EDGE_PACKAGES)
        and any(within(imp.target, p) for p in EDGE_PACKAGES)
    ]
    assert not bad, "the core must not import daemon/connector/testing/bench:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    ("importer", "forbidden"),
    [
        ("tiercache.connector", "tiercache.daemon"),
        ("tiercache.daemon", "tiercache.connector"),
        ("tiercache.connector", "tiercache.testing"),
        ("tiercache.daemon", "tiercache.testing"),
        ("tiercache.connector", "tiercache.bench"),
        ("tiercache.daemon", "tiercache.bench"),
        ("tiercache.testing", "tiercache.bench"),
    ],
)
def test_edge_packages_import_only_downwards(importer: str, forbidden: str) -> None:
    bad = [
        imp.where() for imp in all_imports() if within(imp.module, importer) and within(imp.target, forbidden)
    ]
    assert not bad, f"{importer} must not import {forbidden}:\n" + "\n".join(bad)


def test_no_bare_top_level_imports() -> None:
    bad = [imp.where() for imp in all_imports() if imp.target.split(".")[0] in BARE_NAMES]
    assert not bad, "import these as tiercache.*:\n" + "\n".join(bad)


def test_no_hand_written_module_over_the_limit() -> None:
    sizes = {
        str(path.relative_to(REPO)): len(path.read_text(encoding="utf-8").splitlines())
        for path in source_modules()
    }
    big = sorted(
        f"{name}: {n} lines" for name, n in sizes.items() if n > MAX_MODULE_LINES and name not in GENERATED
    )
    assert not big, f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(big)


# ------------------------------------------------------------------------------------------------ wheel

OPTIONAL = ("transformers", "vllm", "sglang")
"""Packages of optional extras (hf, vllm, sglang) that some modules import at the top."""

_IMPORT_ALL = """
import importlib, json, sys
names = json.loads(sys.argv[1])
failed = {}
for name in names:
    try:
        module = importlib.import_module(name)
    except Exception as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"
        continue
    if not module.__file__ or not module.__file__.startswith(sys.argv[2]):
        failed[name] = f"imported from {module.__file__}, not from the wheel"
print(json.dumps(failed))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(REPO),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("tiercache-*.whl")
    return built


@pytest.mark.slow
def test_the_wheel_holds_every_module_its_stubs_and_py_typed(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    missing = sorted(
        str(p.relative_to(REPO)) for p in source_modules() if str(p.relative_to(REPO)) not in names
    )
    assert not missing, "not in the wheel:\n" + "\n".join(missing)
    assert "tiercache/proto/tiercache_pb2.pyi" in names
    assert "tiercache/py.typed" in names


@pytest.mark.slow
def test_every_module_imports_from_the_unpacked_wheel(wheel: Path, tmp_path: Path) -> None:
    unpacked = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(unpacked)
    names = [module_name(p) for p in source_modules() if p.name != "__main__.py"]
    # -I: no PYTHONPATH, no user site, neither the script's directory nor the cwd on sys.path; -S: no
    # site-packages .pth files (the editable install's finder would map tiercache to the checkout). The
    # dependencies come from site-packages, added explicitly after the wheel.
    path = [str(unpacked), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    code = f"import sys; sys.path[:0] = {path!r}\n" + _IMPORT_ALL
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code, json.dumps(names), str(unpacked)],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    failed = json.loads(out.stdout.strip().splitlines()[-1])
    # Modules of the hf, vllm and sglang extras need their package, which only those extras install.
    absent = [
        f"ModuleNotFoundError: No module named '{p}'" for p in OPTIONAL if importlib.util.find_spec(p) is None
    ]
    failed = {k: v for k, v in failed.items() if v not in absent}
    assert not failed, "modules that do not import from the wheel:\n" + "\n".join(
        f"{k}: {v}" for k, v in failed.items()
    )


# ------------------------------------------------------------------------------------------ bench inputs


def test_bench_trace_files_parse() -> None:
    from tiercache.bench.workload.traces import read_jsonl

    traces = sorted(BENCH_TRACES.glob("*.jsonl"))
    assert traces, f"no trace files in {BENCH_TRACES}"
    for trace in traces:
        requests = read_jsonl(trace)
        assert len(requests) >= 10 and all(r.tokens.size > 0 for r in requests), trace
