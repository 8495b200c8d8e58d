"""The engine line protocol of :mod:`tiercache.testing.engine`, both sides, with real subprocesses."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tiercache.bench import vllm_engine
from tiercache.testing.engine import MARK, EngineError, EngineProcess

CHILD = """
import sys
from tiercache.testing.engine import next_line, read_params, say
p = read_params()
print("library noise on stdout", flush=True)
say({"ready": p["name"]})
while (line := next_line()) == "go":
    say({"phase": line})
if p.get("fail"):
    print("boom on stderr", file=sys.stderr, flush=True)
    raise SystemExit(3)
say({"done": p["name"], "last": line})
"""


def _engine(tmp_path: Path, **params: object) -> EngineProcess:
    return EngineProcess([sys.executable, "-c", CHILD], params, stderr_path=tmp_path / "engine.log")


def test_params_messages_lines_and_the_result(tmp_path: Path) -> None:
    engine = _engine(tmp_path, name="a")
    try:
        assert engine.message(60.0) == {"ready": "a"}
        engine.tell("go")
        assert engine.message(60.0) == {"phase": "go"}
        assert engine.result(60.0) == {"done": "a", "last": ""}  # stdin closed: an empty line
        assert "library noise on stdout" in engine.output
    finally:
        engine.close()


def test_a_failing_engine_raises_with_its_stderr(tmp_path: Path) -> None:
    engine = _engine(tmp_path, name="b", fail=True)
    try:
        assert engine.message(60.0) == {"ready": "b"}
        with pytest.raises(EngineError, match="exited with 3") as info:
            engine.result(60.0)
        assert "boom on stderr" in str(info.value)
        with pytest.raises(EngineError, match="exited with 3"):
            engine.message(1.0)
    finally:
        engine.close()


def test_a_silent_engine_times_out_and_is_killed(tmp_path: Path) -> None:
    engine = EngineProcess([sys.executable, "-c", "import time; time.sleep(600)"], {})
    try:
        with pytest.raises(EngineError, match="said nothing within 0s"):
            engine.message(0.2)
    finally:
        engine.close()
    assert engine.proc.returncode is not None


def test_the_bench_vllm_engine_speaks_the_same_protocol() -> None:
    assert vllm_engine.MARK == MARK  # restated there: it runs in venvs without tiercache
