"""How a connector moves bytes: the data-plane choice, the byte stream's codec, lease and ticket TTLs and
the engine's cost models.

Primitives:
    ConnectorConfig: the options of one :class:`~.engine.KVConnector`.
"""

from __future__ import annotations

from dataclasses import dataclass

from tiercache.codec import Codec
from tiercache.errors import InvalidArgumentError
from tiercache.policies.load import DeadlineModel, PrefillModel


@dataclass(frozen=True, slots=True)
class ConnectorConfig:
    """How a connector moves bytes.

    Attributes:
        force_remote: always use the byte stream, even when the shared-memory segment is reachable.
        codec: codec of the byte stream (RAW or ZSTD).
        load_ttl_s: lifetime of a load lease (0: the daemon's default).
        store_ttl_s: lifetime of a store ticket (0: the daemon's default).
        prefill: the engine's prefill model, declared at registration (needed for cost-aware loads).
        deadline: the engine's load-deadline model, declared at registration (timeout loads without a
            timeout of their own).
        prefill_ttl_s: lifetime of a single-flight prefill claim, renewed by each publication (0: the
            daemon's lease TTL); a leader that dies loses its claim after this long.
        report_usage: after each load, tell the daemon which loaded tokens the engine skips and which cached
            tokens it recomputes (turn off for an engine that reports with ``report_usage`` itself).
    """

    force_remote: bool = False
    codec: Codec = Codec.RAW
    load_ttl_s: float = 0.0
    store_ttl_s: float = 0.0
    prefill: PrefillModel | None = None
    deadline: DeadlineModel | None = None
    prefill_ttl_s: float = 0.0
    report_usage: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.codec, Codec):
            raise InvalidArgumentError("codec", f"must be a Codec, got {self.codec!r}")
        for name in ("load_ttl_s", "store_ttl_s", "prefill_ttl_s"):
            if not getattr(self, name) >= 0:
                raise InvalidArgumentError(name, f"must be >= 0, got {getattr(self, name)!r}")
        if self.prefill is not None and not isinstance(self.prefill, PrefillModel):
            raise InvalidArgumentError("prefill", f"must be a PrefillModel, got {self.prefill!r}")
        if self.deadline is not None and not isinstance(self.deadline, DeadlineModel):
            raise InvalidArgumentError("deadline", f"must be a DeadlineModel, got {self.deadline!r}")
