"""The columns of ``tiercache-bench serve``: one ``vllm serve`` (and its cache process) per column.

* ``plain``: vLLM alone, prefix caching on;
* ``ideal``: vLLM alone with an engine cache that holds the largest working set (plus a block per request):
  the plain server of the "fits" rows;
* ``tiercache_l2``: the TierCacheConnector on a daemon whose L2 holds what the run stores (L3 behind it, so
  that a killed daemon restarts on its chunks);
* ``tiercache_l3``: the same with an L2 of the engine cache's size: most of the working set comes from L3;
* ``tiercache_rpc``: ``tiercache_l2`` with the connector's ``published_index`` off: every lookup is a daemon
  call (what the published index is measured against);
* ``lmcache``: LMCache's multiprocess server and ``LMCacheMPConnector``, both from the venv of
  ``--lmcache-python`` (skipped with the reason without one);
* ``native``: vLLM's own CPU offloading (``--kv-offloading-backend native``); vLLM refuses it on CPU, and the
  column then says why with vLLM's error.

Every workload is sized to outgrow the run's engine cache (``engine_tokens``); its "fits" rows come from
servers whose engine cache is the ideal's (:func:`plans`). Every server has the same model, block size, max
model length, thread count and binding (``nobind``).

Primitives:
    ColumnKind: the columns.
    ServerPlan / plans: the servers of a run and the rows each measures.
    Setup: what every server of a run shares.
    Served: a running column (its server, and its daemon when it has one).
    serve_column: context manager starting a column's processes.
    kv_bytes_per_token: KV bytes of one token of the bench's model.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tiercache.policies import WritePolicyKind
from tiercache.testing.daemon import DaemonProcess
from tiercache.testing.embedded import EmbeddedDaemonConfig, daemon_process
from tiercache.testing.vllm_server import VllmServer, VllmServerConfig

from ..vllm_engines.peers import lmcache_server

logger = logging.getLogger(__name__)


class ColumnKind(enum.Enum):
    """A column (see the module docstring)."""

    PLAIN = "plain"
    IDEAL = "ideal"
    TIERCACHE_L2 = "tiercache_l2"
    TIERCACHE_L3 = "tiercache_l3"
    TIERCACHE_RPC = "tiercache_rpc"
    LMCACHE = "lmcache"
    NATIVE = "native"


TIERCACHE = (ColumnKind.TIERCACHE_L2, ColumnKind.TIERCACHE_L3, ColumnKind.TIERCACHE_RPC)


def kv_bytes_per_token(hidden: int, layers: int) -> int:
    """KV bytes of one token: float32 K and V of every layer's KV heads (head size 64, half the heads)."""
    return layers * 2 * max(1, hidden // 128) * 64 * 4


@dataclass(frozen=True, slots=True)
class Setup:
    """What every column's server of a run shares.

    Attributes:
        model: the model directory.
        work: the run's scratch directory.
        engine_tokens: the engine cache of every column but the ideal (tokens).
        ideal_tokens: the ideal's engine cache (tokens).
        store_tokens: what the run stores through a connector, at most (sizes the daemons' L2 / L3).
        max_model_len: the longest sequence.
        block_size: tokens per block.
        chunk_tokens: tiercache's chunk.
        bytes_per_token: KV bytes per token.
        threads: OMP threads of every server.
        lmcache_python: LMCache's venv interpreter ("" to skip the column).
        write_policy: the tiercache daemons' write policy.
    """

    model: Path
    work: Path
    engine_tokens: int
    ideal_tokens: int
    store_tokens: int
    max_model_len: int
    block_size: int
    chunk_tokens: int
    bytes_per_token: int
    threads: int
    lmcache_python: str
    write_policy: WritePolicyKind

    def server(self, name: str, tokens: int, **kw: Any) -> VllmServer:
        config = VllmServerConfig(self.model, tokens * self.bytes_per_token, self.block_size,
                                  self.max_model_len, threads=self.threads, **kw)  # fmt: skip
        return VllmServer(config, self.work / f"server-{name}.log")

    def daemon(self, kind: ColumnKind, name: str) -> DaemonProcess:
        """A column's daemon (not started) on an empty L3 (a restart after a kill keeps it)."""
        chunk = self.chunk_tokens * self.bytes_per_token
        store = (self.store_tokens // self.chunk_tokens + 16) * chunk
        l2 = (
            store
            if kind is not ColumnKind.TIERCACHE_L3
            else max(8 * chunk, self.engine_tokens * self.bytes_per_token)
        )
        config = EmbeddedDaemonConfig(
            slot_bytes=chunk, l2_bytes=l2, l3_bytes=store, write_policy=self.write_policy
        )
        sock_dir = Path(tempfile.mkdtemp(prefix="tcserve-"))  # short: a unix socket path has ~107 bytes
        l3 = self.work / f"l3-{name}"
        # Every server starts cold: a repeat must not find the chunks of the one before.
        shutil.rmtree(l3, ignore_errors=True)
        return daemon_process(config, self.work, l3, sock_dir / "d.sock", "serve")


@dataclass(slots=True)
class Served:
    """A running column.

    Attributes:
        kind: the column.
        server: its ``vllm serve``.
        daemon: its tiercache daemon (tiercache columns only).
    """

    kind: ColumnKind
    server: VllmServer
    daemon: DaemonProcess | None = None


def tiercache_transfer(address: str, chunk_tokens: int, published_index: bool = True) -> dict[str, Any]:
    """The ``--kv-transfer-config`` of the tiercache connector."""
    extra = {"address": address, "chunk_tokens": chunk_tokens, "published_index": published_index}
    return {"kv_connector": "TierCacheConnector", "kv_connector_module_path": "tiercache.connector.vllm",
            "kv_role": "kv_both", "kv_load_failure_policy": "recompute", "kv_connector_extra_config": extra}  # fmt: skip


@dataclass(frozen=True, slots=True)
class ServerPlan:
    """One server of a run and the rows it measures.

    Attributes:
        kind: whose processes (``plain`` for the ideal).
        big: its engine cache holds the working set (the ideal's size), else the run's engine cache.
        rows: the (column, fits) rows its measurements are: the big plain server is plain vLLM where the
            working set fits and the ideal where it outgrows the run's engine cache.
    """

    kind: ColumnKind
    big: bool
    rows: tuple[tuple[ColumnKind, bool], ...]

    @property
    def name(self) -> str:
        return f"{self.kind.value}-{'big' if self.big else 'small'}"


def plans(columns: Sequence[ColumnKind], sets: Sequence[bool]) -> list[ServerPlan]:
    """The servers that measure ``columns`` for the ``sets`` (True: fits, False: outgrows), in run order
    (each column's outgrowing server first): tiercache with L3 serving or without the index (where the
    working set fits, the index answers nothing) and native offloading only outgrow."""
    out = []
    for kind in columns:
        if kind is ColumnKind.IDEAL:
            continue  # measured by the big plain server
        small: list[tuple[ColumnKind, bool]] = [(kind, False)] if False in sets else []
        big: list[tuple[ColumnKind, bool]] = (
            [(kind, True)]
            if True in sets
            and kind not in (ColumnKind.TIERCACHE_L3, ColumnKind.TIERCACHE_RPC, ColumnKind.NATIVE)
            else []
        )
        if kind is ColumnKind.PLAIN and ColumnKind.IDEAL in columns and False in sets:
            big.append((ColumnKind.IDEAL, False))
        out += [ServerPlan(kind, b, tuple(rows)) for b, rows in ((False, small), (True, big)) if rows]
    if ColumnKind.IDEAL in columns and ColumnKind.PLAIN not in columns and False in sets:
        out.append(ServerPlan(ColumnKind.PLAIN, True, ((ColumnKind.IDEAL, False),)))
    return out


@contextlib.contextmanager
def serve_column(kind: ColumnKind, setup: Setup, big: bool = False) -> Iterator[Served]:
    """Start ``kind``'s processes (its engine cache the ideal's when ``big``), yield them, stop them.

    Raises:
        VllmServerError / DaemonStartError / RuntimeError: a process did not start (a column that cannot
            run here, such as ``native`` on CPU, fails here: the caller records why).
    """
    tokens = setup.ideal_tokens if big else setup.engine_tokens
    name = f"{kind.value}-{'big' if big else 'small'}"
    if kind in (ColumnKind.PLAIN, ColumnKind.IDEAL):
        with setup.server(name, tokens) as server:
            yield Served(kind, server)
    elif kind in TIERCACHE:
        daemon = setup.daemon(kind, name)
        try:
            daemon.start()
            transfer = tiercache_transfer(
                daemon.address, setup.chunk_tokens, kind is not ColumnKind.TIERCACHE_RPC
            )
            with setup.server(name, tokens, kv_transfer_config=transfer) as server:
                yield Served(kind, server, daemon)
        finally:
            daemon.cleanup()
            shutil.rmtree(daemon.socket.parent, ignore_errors=True)
    elif kind is ColumnKind.LMCACHE:
        python = setup.lmcache_python
        with lmcache_server(setup.work, python) as port:
            transfer = {"kv_connector": "LMCacheMPConnector", "kv_role": "kv_both",
                        "kv_connector_extra_config": {"lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": port}}  # fmt: skip
            env = {"LMCACHE_TRACK_USAGE": "false", "LMCACHE_DISABLE_BANNER": "1"}
            with setup.server(name, tokens, kv_transfer_config=transfer, python=python, env=env) as server:
                yield Served(kind, server)
    else:
        size_gib = f"{max(setup.store_tokens * setup.bytes_per_token / (1 << 30), 0.01):.3f}"
        extra = ("--kv-offloading-backend", "native", "--kv-offloading-size", size_gib)
        with setup.server(name, tokens, extra_args=extra) as server:
            yield Served(kind, server)
