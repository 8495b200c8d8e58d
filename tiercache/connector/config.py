"""How a connector moves bytes: the data-plane choice, the byte stream's codec, lease and ticket TTLs and
the engine's cost models; and how its channel is secured on TCP.

Primitives:
    DataPlaneMode: the data plane an engine asks for: ``auto`` (shared memory when the daemon's segment can
        be mapped here, else the byte stream), ``shm`` or ``stream`` (resolved by :mod:`.handlers`).
    ConnectorConfig: the options of one :class:`~.engine.KVConnector`.
    ClientTls: TLS of a TCP channel: the CA that signs the daemon's certificate, and the client certificate
        and key of mutual TLS (used by :class:`~.channel.ChannelConfig`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import grpc

from tiercache.codec import Codec
from tiercache.errors import InvalidArgumentError
from tiercache.policies.load import DeadlineModel, PrefillModel


class DataPlaneMode(Enum):
    """Which data plane an engine asks for (the value is what its options spell)."""

    AUTO = "auto"
    SHM = "shm"
    STREAM = "stream"


@dataclass(frozen=True, slots=True)
class ConnectorConfig:
    """How a connector moves bytes.

    Attributes:
        data_plane: ``auto`` (default: the daemon's shared memory when its segment can be mapped in this
            process, else the byte stream), ``shm`` or ``stream`` (the byte stream even when the segment is
            reachable).
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

    data_plane: DataPlaneMode = DataPlaneMode.AUTO
    codec: Codec = Codec.RAW
    load_ttl_s: float = 0.0
    store_ttl_s: float = 0.0
    prefill: PrefillModel | None = None
    deadline: DeadlineModel | None = None
    prefill_ttl_s: float = 0.0
    report_usage: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.data_plane, DataPlaneMode):
            raise InvalidArgumentError("data_plane", f"must be a DataPlaneMode, got {self.data_plane!r}")
        if not isinstance(self.codec, Codec):
            raise InvalidArgumentError("codec", f"must be a Codec, got {self.codec!r}")
        for name in ("load_ttl_s", "store_ttl_s", "prefill_ttl_s"):
            if not getattr(self, name) >= 0:
                raise InvalidArgumentError(name, f"must be >= 0, got {getattr(self, name)!r}")
        if self.prefill is not None and not isinstance(self.prefill, PrefillModel):
            raise InvalidArgumentError("prefill", f"must be a PrefillModel, got {self.prefill!r}")
        if self.deadline is not None and not isinstance(self.deadline, DeadlineModel):
            raise InvalidArgumentError("deadline", f"must be a DeadlineModel, got {self.deadline!r}")


@dataclass(frozen=True, slots=True)
class ClientTls:
    """TLS of a channel to a daemon's TCP listener (PEM files; empty strings: not set).

    Attributes:
        ca_file: CA certificates that sign the daemon's certificate (empty: the system's roots).
        cert_file: the client's certificate chain, for a daemon that demands mutual TLS.
        key_file: the private key of ``cert_file``.
        server_name: the name to check the daemon's certificate against, when it is not the address's host.
    """

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    server_name: str = ""

    def __post_init__(self) -> None:
        for name in ("ca_file", "cert_file", "key_file", "server_name"):
            if not isinstance(getattr(self, name), str):
                raise InvalidArgumentError(name, f"must be a string, got {getattr(self, name)!r}")
        if bool(self.cert_file) != bool(self.key_file):
            raise InvalidArgumentError(
                "key_file" if self.cert_file else "cert_file", "cert_file and key_file go together"
            )

    def credentials(self) -> grpc.ChannelCredentials:
        """The channel credentials (files read now).

        Raises:
            InvalidArgumentError: naming the field, when a file cannot be read or holds no PEM block.
        """
        ca = _pem(self.ca_file, "ca_file") if self.ca_file else None
        key = _pem(self.key_file, "key_file") if self.key_file else None
        cert = _pem(self.cert_file, "cert_file") if self.cert_file else None
        return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


def _pem(path: str, field: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise InvalidArgumentError(field, f"cannot read {path}: {exc.strerror or exc}") from None
    if b"-----BEGIN " not in data:
        raise InvalidArgumentError(field, f"{path} holds no PEM block")
    return data
