"""The daemon's configuration: one frozen dataclass per component, and their validation.

Values arrive as strings (CLI flags, ``TIERCACHE_*`` environment variables) or TOML scalars; each option has
one parser (:mod:`.parsers`) that accepts both and raises :class:`ConfigError` naming the option. :mod:`.options` decides which
source wins; this module turns the resolved flat :class:`Options` into the per-component configs.

Primitives:
    ConfigError: a bad option value; names the option (and where the value came from).
    Options: every option, resolved and typed (flat; what the CLI documents).
    ListenConfig, StreamConfig, MetricsConfig, TierConfigs: daemon sub-configs.
    DaemonConfig: all sub-configs (core ``CacheConfig`` and tier configs included), validated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tiercache.cache import CacheConfig
from tiercache.codec import Codec
from tiercache.errors import InvalidArgumentError
from tiercache.policies import EvictionPolicyKind, WritePolicyKind
from tiercache.tiers.hbm import HbmTierConfig
from tiercache.tiers.host import HostTierConfig
from tiercache.tiers.lmdb import LmdbTierConfig
from tiercache.tiers.shared import SharedTierConfig
from tiercache.tiers.values import HEADER_BYTES

from .parsers import L1Device
from .tls import TlsConfig

MESSAGE_OVERHEAD_BYTES = 4096
"""Room a stream message needs besides its data bytes (keys, offsets, framing)."""


class ConfigError(InvalidArgumentError):
    """A bad option value. ``field`` is the option's name (underscores, as in the TOML file).

    Attributes:
        option: the option name with underscores.
        source: where the value came from (``--flag``, ``TIERCACHE_X``, the config file), or empty.
    """

    def __init__(self, option: str, message: str, source: str = "") -> None:
        flag = "--" + option.replace("_", "-")
        where = f" (from {source})" if source and source != flag else ""
        super().__init__(option, message)
        self.option = option
        self.source = source
        self.args = (f"{flag}{where}: {message}",)

    def __str__(self) -> str:
        return str(self.args[0])


def _core_message(exc: InvalidArgumentError) -> str:
    """The message of a core error without its ``field: `` prefix."""
    text = str(exc)
    prefix = f"{exc.field}: "
    return text[len(prefix) :] if text.startswith(prefix) else text


def reraise_as_option(exc: InvalidArgumentError, option: str) -> ConfigError:
    """A ConfigError for ``option`` carrying a core validation message."""
    return ConfigError(option, _core_message(exc))


# ---------------------------------------------------------------------------------------------- parsers


# ---------------------------------------------------------------------------------------------- configs


@dataclass(frozen=True, slots=True)
class Options:
    """Every option of ``tiercache-daemon``, resolved (defaults < TOML < environment < CLI) and typed.

    Attributes mirror the CLI flags (``--slot-bytes`` is ``slot_bytes``); sizes are bytes, times seconds.
    """

    socket: str
    socket_mode: int
    tcp: str
    tokens_file: str
    tls_cert: str
    tls_key: str
    tls_client_ca: str
    allow_plaintext_tcp: bool
    slot_bytes: int
    l1_device: str
    l1_bytes: int
    l2_bytes: int
    l2_prefix: str
    l2_verify_loads: bool
    l3_path: str
    l3_bytes: int
    l3_codec: Codec
    l3_zstd_level: int
    l3_durable: bool
    l3_fault_read_delay_s: float
    l3_fault_read_bytes_per_s: int
    write_policy: WritePolicyKind
    eviction_policy: EvictionPolicyKind
    selective_min_hits: int
    lease_ttl_s: float
    max_ttl_s: float
    min_residency_s: float
    metrics_port: int
    metrics_host: str
    max_message_bytes: int
    stream_chunk_bytes: int
    torch_threads: int
    log_level: str
    shared_url: str = ""
    shared_codec: Codec = Codec.RAW
    shared_timeout_s: float = 0.5
    page_bytes: int = 0
    control_socket: bool = True


@dataclass(frozen=True, slots=True)
class ListenConfig:
    """Where the gRPC server listens and who may call it.

    Attributes:
        socket: unix socket path, empty for none.
        socket_mode: permission bits of the socket file.
        tcp: ``HOST:PORT``, empty for none.
        tokens_file: TOML file of bearer tokens, empty for no authentication.
        tls: TLS of the TCP listener (off: plaintext).
        control_socket: with ``socket``, also serve the unary calls on ``<socket>.ctl``
            (:mod:`tiercache.wire.control`).
    """

    socket: str
    socket_mode: int
    tcp: str
    tokens_file: str
    tls: TlsConfig = field(default_factory=TlsConfig)
    control_socket: bool = True


@dataclass(frozen=True, slots=True)
class StreamConfig:
    """Message limits of the gRPC server.

    Attributes:
        max_message_bytes: gRPC's receive and send limit per message.
        stream_chunk_bytes: most data bytes in one byte-stream message.
    """

    max_message_bytes: int
    stream_chunk_bytes: int


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    """The Prometheus endpoint.

    Attributes:
        port: TCP port of ``/metrics``; 0 for off.
        host: address it binds.
    """

    port: int
    host: str


@dataclass(frozen=True, slots=True)
class TierConfigs:
    """The tiers to build: L1 when ``l1`` is set, L2 always, L3 when ``l3`` is set, the shared tier when
    ``shared`` is set."""

    l1: HbmTierConfig | None
    l2: HostTierConfig
    l3: LmdbTierConfig | None
    shared: SharedTierConfig | None = None


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    """The validated configuration of one daemon, one sub-config per component.

    Attributes:
        listen: sockets and authentication.
        tiers: tier configs (core dataclasses).
        cache: the cache manager's policies and timing (core dataclass).
        stream: message size limits.
        metrics: the Prometheus endpoint.
        torch_threads: torch intra-op threads of the daemon process.
        log_level: logging level name.
    """

    listen: ListenConfig
    tiers: TierConfigs
    cache: CacheConfig
    stream: StreamConfig
    metrics: MetricsConfig
    torch_threads: int
    log_level: str

    @classmethod
    def from_options(cls, opts: Options, cuda_devices: int) -> DaemonConfig:
        """Validate the options across each other and build the sub-configs.

        Args:
            opts: resolved options.
            cuda_devices: CUDA devices on this host (resolves ``--l1-device auto``, checks ``cuda:N``).

        Raises:
            ConfigError: naming the offending option.
        """
        if not opts.socket and not opts.tcp:
            raise ConfigError("socket", "both --socket and --tcp are empty: nothing to listen on")
        if opts.socket and len(opts.socket.encode()) > 107:
            raise ConfigError(
                "socket", f"path is longer than a unix socket allows (107 bytes): {opts.socket}"
            )
        if opts.slot_bytes <= 0:
            raise ConfigError("slot_bytes", "must be positive")
        if not 0 <= opts.page_bytes <= opts.slot_bytes:
            raise ConfigError(
                "page_bytes", f"must be in [0, --slot-bytes = {opts.slot_bytes}], got {opts.page_bytes}"
            )
        for name, value in (("l2_bytes", opts.l2_bytes), ("l1_bytes", opts.l1_bytes)):
            if value < opts.slot_bytes:
                raise ConfigError(name, f"{value} bytes is smaller than one slot ({opts.slot_bytes} bytes)")
        _check_prefix(opts.l2_prefix)
        if opts.selective_min_hits <= 0:
            raise ConfigError(
                "selective_min_hits", f"must be a positive integer, got {opts.selective_min_hits}"
            )
        if opts.torch_threads <= 0:
            raise ConfigError("torch_threads", f"must be a positive integer, got {opts.torch_threads}")
        if not 0 <= opts.metrics_port <= 65535:
            raise ConfigError("metrics_port", f"must be in [0, 65535], got {opts.metrics_port}")
        if opts.max_message_bytes <= MESSAGE_OVERHEAD_BYTES:
            raise ConfigError("max_message_bytes", f"must exceed {MESSAGE_OVERHEAD_BYTES}")
        if not 0 < opts.stream_chunk_bytes <= opts.max_message_bytes - MESSAGE_OVERHEAD_BYTES:
            raise ConfigError(
                "stream_chunk_bytes",
                f"must be in (0, max_message_bytes - {MESSAGE_OVERHEAD_BYTES}] = "
                f"(0, {opts.max_message_bytes - MESSAGE_OVERHEAD_BYTES}], got {opts.stream_chunk_bytes}",
            )
        try:
            cache = CacheConfig(
                write_policy=opts.write_policy,
                eviction_policy=opts.eviction_policy,
                selective_min_hits=opts.selective_min_hits,
                min_residency_s=opts.min_residency_s,
                lease_ttl_s=opts.lease_ttl_s,
                max_ttl_s=opts.max_ttl_s,
            )
        except InvalidArgumentError as exc:
            raise reraise_as_option(exc, exc.field) from None
        return cls(
            listen=ListenConfig(
                opts.socket,
                opts.socket_mode,
                opts.tcp,
                opts.tokens_file,
                _tls_config(opts),
                opts.control_socket,
            ),
            tiers=TierConfigs(
                l1=_l1_config(opts, cuda_devices),
                l2=HostTierConfig(
                    capacity_bytes=opts.l2_bytes,
                    slot_bytes=opts.slot_bytes,
                    segment_prefix=opts.l2_prefix,
                    verify_loads=opts.l2_verify_loads,
                    page_bytes=opts.page_bytes,
                ),
                l3=_l3_config(opts),
                shared=_shared_config(opts),
            ),
            cache=cache,
            stream=StreamConfig(opts.max_message_bytes, opts.stream_chunk_bytes),
            metrics=MetricsConfig(opts.metrics_port, opts.metrics_host),
            torch_threads=opts.torch_threads,
            log_level=opts.log_level,
        )


def _check_prefix(prefix: str) -> None:
    if not prefix or "/" in prefix or prefix.startswith(".") or len(prefix) > 150:
        raise ConfigError("l2_prefix", f"{prefix!r} is not a valid shared-memory name prefix")


def _l1_config(opts: Options, cuda_devices: int) -> HbmTierConfig | None:
    device = opts.l1_device
    if device == L1Device.AUTO.value:
        device = L1Device.CUDA.value if cuda_devices > 0 else L1Device.NONE.value
    if device == L1Device.NONE.value:
        return None
    if device.startswith(L1Device.CUDA.value):
        index = int(device.partition(":")[2] or 0)
        if index >= cuda_devices:
            raise ConfigError("l1_device", f"{device!r}: this host has {cuda_devices} CUDA device(s)")
    return HbmTierConfig(
        capacity_bytes=opts.l1_bytes, slot_bytes=opts.slot_bytes, device=device, page_bytes=opts.page_bytes
    )


def _l3_config(opts: Options) -> LmdbTierConfig | None:
    if not opts.l3_path:
        return None
    if opts.l3_bytes < opts.slot_bytes + HEADER_BYTES:
        raise ConfigError("l3_bytes", f"{opts.l3_bytes} bytes cannot hold one chunk of --slot-bytes")
    fields = {"path": "l3_path", "capacity_bytes": "l3_bytes", "zstd_level": "l3_zstd_level"}
    try:
        return LmdbTierConfig(
            path=opts.l3_path,
            capacity_bytes=opts.l3_bytes,
            codec=opts.l3_codec,
            zstd_level=opts.l3_zstd_level,
            durable=opts.l3_durable,
            fault_read_delay_s=opts.l3_fault_read_delay_s,
            fault_read_bytes_per_s=opts.l3_fault_read_bytes_per_s,
        )
    except InvalidArgumentError as exc:
        raise reraise_as_option(exc, fields.get(exc.field, "l3_" + exc.field)) from None


def _shared_config(opts: Options) -> SharedTierConfig | None:
    if not opts.shared_url:
        return None
    fields = {"url": "shared_url", "codec": "shared_codec", "op_timeout_s": "shared_timeout_s"}
    try:
        return SharedTierConfig(
            url=opts.shared_url,
            codec=opts.shared_codec,
            op_timeout_s=opts.shared_timeout_s,
            connect_timeout_s=opts.shared_timeout_s,
        )
    except InvalidArgumentError as exc:
        raise reraise_as_option(exc, fields.get(exc.field, "shared_" + exc.field)) from None


def _tls_config(opts: Options) -> TlsConfig:
    """The TLS files, checked across each other and against the tokens (plaintext TCP + tokens refused)."""
    if bool(opts.tls_cert) != bool(opts.tls_key):
        missing = "tls_key" if opts.tls_cert else "tls_cert"
        raise ConfigError(missing, "--tls-cert and --tls-key go together: set both or neither")
    if opts.tls_client_ca and not opts.tls_cert:
        raise ConfigError("tls_client_ca", "mutual TLS needs --tls-cert and --tls-key as well")
    if opts.tls_cert and not opts.tcp:
        raise ConfigError("tls_cert", "set, but --tcp is empty: TLS applies to the TCP listener only")
    if opts.tcp and opts.tokens_file and not opts.tls_cert and not opts.allow_plaintext_tcp:
        raise ConfigError(
            "allow_plaintext_tcp",
            f"refusing a plaintext TCP listener on {opts.tcp} with a tokens file: bearer tokens would cross "
            "the network in clear text; set --tls-cert and --tls-key, or --allow-plaintext-tcp to accept that",
        )
    return TlsConfig(opts.tls_cert, opts.tls_key, opts.tls_client_ca)
