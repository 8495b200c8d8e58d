"""The daemon's configuration: one frozen dataclass per component, the options it declares, and validation.

Every option is declared once, as a field of the config dataclass of the component it configures
(:mod:`tiercache.options`): the daemon's own components here (listening, TLS, stream limits, metrics, the
process), the core's in their modules (:class:`~tiercache.cache.CacheConfig`, the tier configs, the
``slot_bytes`` and ``page_bytes`` of :mod:`tiercache.tiers.pages`). :class:`DaemonConfig` nests them all;
:mod:`.options` resolves every option's value from its sources, and :meth:`DaemonConfig.from_values` checks
the values across each other and builds the configs.

Primitives:
    ConfigError: a bad option value; names the option (and where the value came from).
    ListenConfig, StreamConfig, MetricsConfig, TierConfigs: daemon sub-configs.
    DaemonConfig: all sub-configs (core ``CacheConfig`` and tier configs included), validated.
    default_socket: the socket path of this user.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tiercache.cache import CacheConfig
from tiercache.errors import InvalidArgumentError
from tiercache.options import Computed, Values, build, nested, option
from tiercache.parsers import parse_bool, parse_int, parse_octal, parse_size, parse_str
from tiercache.tiers.hbm import HbmTierConfig
from tiercache.tiers.host import HostTierConfig
from tiercache.tiers.lmdb import LmdbTierConfig
from tiercache.tiers.shared import SharedTierConfig
from tiercache.tiers.values import HEADER_BYTES

from .fairness import FairShares
from .parsers import L1Device, parse_device, parse_log_level, parse_tcp
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


def reraise_as_option(exc: InvalidArgumentError, option: str) -> ConfigError:
    """A ConfigError for ``option`` carrying a core validation message (without its ``field: `` prefix)."""
    return ConfigError(option, str(exc).removeprefix(f"{exc.field}: "))


def default_socket(env: Mapping[str, str]) -> str:
    """``$XDG_RUNTIME_DIR/tiercache/daemon.sock``, else ``/tmp/tiercache-<uid>/daemon.sock``."""
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime:
        return str(Path(runtime) / "tiercache" / "daemon.sock")
    return f"/tmp/tiercache-{os.getuid()}/daemon.sock"


@dataclass(frozen=True, slots=True, kw_only=True)
class ListenConfig:
    """Where the gRPC server listens and who may call it.

    Attributes:
        socket: unix socket path, empty for none.
        socket_mode: permission bits of the socket file.
        control_socket: with ``socket``, also serve the unary calls on ``<socket>.ctl``
            (:mod:`tiercache.wire.control`).
        tcp: ``HOST:PORT``, empty for none.
        tokens_file: TOML file of bearer tokens, empty for no authentication.
        allow_plaintext_tcp: a plaintext TCP listener is accepted with a tokens file.
        allow_unauthenticated_tcp: a TCP listener is accepted without a tokens file.
        admin_token_file: file holding the operator's bearer token, empty for none.
        diagnostics: serve the ``tiercache.v1.Diagnostics`` echo service.
        tls: TLS of the TCP listener (off: plaintext).
    """

    socket: str = option(
        "socket",
        parse=parse_str,
        help='unix socket to listen on ("" disables); its directory is created with mode 0700',
        metavar="PATH",
        computed=Computed(
            lambda values: default_socket(values.env),
            "$XDG_RUNTIME_DIR/tiercache/daemon.sock, else /tmp/tiercache-<uid>/daemon.sock",
            on_host=True,
            example="/run/tiercache/daemon.sock",
        ),
    )
    socket_mode: int = option(
        "socket_mode",
        parse=parse_octal,
        help="permission bits of the socket file (0666 lets other users' engines connect: pair it with "
        "--tokens-file)",
        metavar="OCTAL",
        default=0o600,
    )
    control_socket: bool = option(
        "control_socket",
        parse=parse_bool,
        help="also serve the unary calls on <socket>.ctl, a plain unix socket that same-host engines use instead "
        "of gRPC (a call ~0.4-0.8 ms instead of ~1.5-2 ms after idle)",
        default=True,
    )
    tcp: str = option(
        "tcp",
        parse=parse_tcp,
        help="TCP address to listen on as HOST:PORT",
        metavar="HOST:PORT",
        default="",
        note="off",
    )
    tokens_file: str = option(
        "tokens_file",
        parse=parse_str,
        help='TOML file with a [tokens] table of "token" = "tenant" (see daemon/tokens.example.toml); every '
        'call then needs "authorization: Bearer <token>"',
        metavar="PATH",
        default="",
        note="no authentication: one default tenant",
    )
    allow_plaintext_tcp: bool = option(
        "allow_plaintext_tcp",
        parse=parse_bool,
        help="start a plaintext TCP listener although a tokens file is set (the tokens then cross the network "
        "in clear text)",
        default=False,
    )
    allow_unauthenticated_tcp: bool = option(
        "allow_unauthenticated_tcp",
        parse=parse_bool,
        help="start a TCP listener without a tokens file nor mutual TLS (anyone who can reach the port then reads "
        "and writes the cache)",
        default=False,
    )
    admin_token_file: str = option(
        "admin_token_file",
        parse=parse_str,
        help="file holding the operator's bearer token (one line): it opens /metrics and, with a tokens file, "
        "cache-wide Stats; keep it mode 0600",
        metavar="PATH",
        default="",
        note="no operator token",
    )
    diagnostics: bool = option(
        "diagnostics",
        parse=parse_bool,
        help="serve the tiercache.v1.Diagnostics echo service (the baselines of tiercache-bench; it lets any "
        "caller make the daemon send and receive bulk bytes)",
        default=False,
    )
    tls: TlsConfig = nested(TlsConfig)


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamConfig:
    """Message limits of the gRPC server.

    Attributes:
        max_message_bytes: gRPC's receive and send limit per message.
        stream_chunk_bytes: most data bytes in one byte-stream message.
    """

    max_message_bytes: int = option(
        "max_message_bytes",
        parse=parse_size,
        help="largest gRPC message received or sent",
        metavar="SIZE",
        default=8 << 20,
    )
    stream_chunk_bytes: int = option(
        "stream_chunk_bytes",
        parse=parse_size,
        help=f"most data bytes in one StreamLoad message (at most --max-message-bytes - {MESSAGE_OVERHEAD_BYTES})",
        metavar="SIZE",
        default=4 << 20,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricsConfig:
    """The Prometheus endpoint.

    Attributes:
        port: TCP port of ``/metrics``; 0 for off.
        host: address it binds.
        public: serve it to anyone who can reach it (else only to the operator's token).
    """

    port: int = option(
        "metrics_port",
        parse=parse_int,
        help="port of the Prometheus /metrics endpoint",
        metavar="INT",
        default=0,
        note="off",
    )
    host: str = option(
        "metrics_host",
        parse=parse_str,
        help="address the /metrics endpoint binds",
        metavar="HOST",
        default="127.0.0.1",
    )
    public: bool = option(
        "metrics_public",
        parse=parse_bool,
        help="serve /metrics without a token (it shows the whole cache and, with a tokens file, every tenant); "
        "off, scrapers send 'Authorization: Bearer <token of --admin-token-file>'",
        default=False,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class TierConfigs:
    """The tiers to build: L1 when ``l1`` is set, L2 always, L3 when ``l3`` is set, the shared tier when
    ``shared`` is set.

    Attributes:
        l1_device: the ``--l1-device`` asked for (``auto``, ``none``, ``cpu``, ``cuda``, ``cuda:N``); ``l1``
            holds the device it resolved to.
    """

    l1_device: str = option(
        "l1_device",
        parse=parse_device,
        help="device of the L1 tier: auto, cpu, cuda, cuda:N or none",
        metavar="DEVICE",
        default=L1Device.AUTO.value,
        note="cuda when CUDA is available, else none",
    )
    l1: HbmTierConfig | None = nested(HbmTierConfig)
    l2: HostTierConfig = nested(HostTierConfig)
    l3: LmdbTierConfig | None = nested(LmdbTierConfig)
    shared: SharedTierConfig | None = nested(SharedTierConfig)


@dataclass(frozen=True, slots=True, kw_only=True)
class DaemonConfig:
    """The validated configuration of one daemon, one sub-config per component.

    Attributes:
        listen: sockets and authentication.
        tiers: tier configs (core dataclasses).
        cache: the cache manager's policies and timing (core dataclass).
        stream: message size limits.
        metrics: the Prometheus endpoint.
        fairness: what one tenant may hold at once (waits, streams, subscriptions, table entries).
        torch_threads: torch intra-op threads of the daemon process.
        log_level: logging level name.
    """

    listen: ListenConfig = nested(ListenConfig)
    tiers: TierConfigs = nested(TierConfigs)
    cache: CacheConfig = nested(CacheConfig)
    stream: StreamConfig = nested(StreamConfig)
    metrics: MetricsConfig = nested(MetricsConfig)
    fairness: FairShares = nested(FairShares)
    torch_threads: int = option(
        "torch_threads",
        parse=parse_int,
        help="torch intra-op threads in the daemon: its copies are memory-bound, and more threads only contend "
        "with the engines on the same host",
        metavar="INT",
        default=1,
    )
    log_level: str = option(
        "log_level",
        parse=parse_log_level,
        help="DEBUG, INFO, WARNING, ERROR or CRITICAL",
        metavar="LEVEL",
        default="INFO",
    )

    @classmethod
    def from_values(cls, values: Values, cuda_devices: int) -> DaemonConfig:
        """Validate the options across each other and build the sub-configs.

        Args:
            values: every option's resolved value (:func:`tiercache.daemon.options.resolve_options`).
            cuda_devices: CUDA devices on this host (resolves ``--l1-device auto``, checks ``cuda:N``).

        Raises:
            ConfigError: naming the offending option.
        """
        _check(values)
        try:
            cache = build(CacheConfig, values)
            listen = build(ListenConfig, values, tls=_tls_config(values))
            tiers = build(
                TierConfigs,
                values,
                l1=_l1_config(values, cuda_devices),
                l2=build(HostTierConfig, values),
                l3=_l3_config(values),
                shared=build(SharedTierConfig, values) if values.get_str("shared_url") else None,
            )
            return build(
                cls,
                values,
                listen=listen,
                tiers=tiers,
                cache=cache,
                stream=build(StreamConfig, values),
                metrics=build(MetricsConfig, values),
                fairness=build(FairShares, values),
            )
        except ConfigError:
            raise
        except InvalidArgumentError as exc:
            raise reraise_as_option(exc, exc.field) from None


def _check(values: Values) -> None:
    """The checks of each option against the others (the configs check each value on its own)."""
    socket, tcp, slot = values.get_str("socket"), values.get_str("tcp"), values.get_int("slot_bytes")
    if not socket and not tcp:
        raise ConfigError("socket", "both --socket and --tcp are empty: nothing to listen on")
    if socket and len(socket.encode()) > 107:
        raise ConfigError("socket", f"path is longer than a unix socket allows (107 bytes): {socket}")
    if slot <= 0:
        raise ConfigError("slot_bytes", "must be positive")
    page = values.get_int("page_bytes")
    if not 0 <= page <= slot:
        raise ConfigError("page_bytes", f"must be in [0, --slot-bytes = {slot}], got {page}")
    for name in ("l2_bytes", "l1_bytes"):
        if values.get_int(name) < slot:
            raise ConfigError(name, f"{values.get_int(name)} bytes is smaller than one slot ({slot} bytes)")
    _check_prefix(values.get_str("l2_prefix"))
    for name in ("selective_min_hits", "torch_threads"):
        if values.get_int(name) <= 0:
            raise ConfigError(name, f"must be a positive integer, got {values.get_int(name)}")
    port = values.get_int("metrics_port")
    if not 0 <= port <= 65535:
        raise ConfigError("metrics_port", f"must be in [0, 65535], got {port}")
    if port and not values["metrics_public"] and not values.get_str("admin_token_file"):
        raise ConfigError(
            "metrics_public",
            f"/metrics on port {port} shows the whole cache (with tokens, every tenant) and is the operator's: "
            "set --admin-token-file (scrapers then send 'Authorization: Bearer <admin token>'), or "
            "--metrics-public to serve it to anyone who can reach it",
        )

    max_message, chunk = values.get_int("max_message_bytes"), values.get_int("stream_chunk_bytes")
    if max_message <= MESSAGE_OVERHEAD_BYTES:
        raise ConfigError("max_message_bytes", f"must exceed {MESSAGE_OVERHEAD_BYTES}")
    if not 0 < chunk <= max_message - MESSAGE_OVERHEAD_BYTES:
        raise ConfigError(
            "stream_chunk_bytes",
            f"must be in (0, max_message_bytes - {MESSAGE_OVERHEAD_BYTES}] = "
            f"(0, {max_message - MESSAGE_OVERHEAD_BYTES}], got {chunk}",
        )


def _check_prefix(prefix: str) -> None:
    if not prefix or "/" in prefix or prefix.startswith(".") or len(prefix) > 150:
        raise ConfigError("l2_prefix", f"{prefix!r} is not a valid shared-memory name prefix")


def _l1_config(values: Values, cuda_devices: int) -> HbmTierConfig | None:
    device = values.get_str("l1_device")
    if device == L1Device.AUTO.value:
        device = L1Device.CUDA.value if cuda_devices > 0 else L1Device.NONE.value
    if device == L1Device.NONE.value:
        return None
    if device.startswith(L1Device.CUDA.value):
        index = int(device.partition(":")[2] or 0)
        if index >= cuda_devices:
            raise ConfigError("l1_device", f"{device!r}: this host has {cuda_devices} CUDA device(s)")
    return build(HbmTierConfig, values, device=device)


def _l3_config(values: Values) -> LmdbTierConfig | None:
    if not values.get_str("l3_path"):
        return None
    l3_bytes = values.get_int("l3_bytes")
    if l3_bytes < values.get_int("slot_bytes") + HEADER_BYTES:
        raise ConfigError("l3_bytes", f"{l3_bytes} bytes cannot hold one chunk of --slot-bytes")
    return build(LmdbTierConfig, values)


def _tls_config(values: Values) -> TlsConfig:
    """The TLS files, checked across each other and against the tokens (plaintext TCP + tokens refused; TCP
    with neither tokens nor client certificates refused unless opted in)."""
    tls = build(TlsConfig, values)
    tcp = values.get_str("tcp")
    if bool(tls.cert) != bool(tls.key):
        missing = "tls_key" if tls.cert else "tls_cert"
        raise ConfigError(missing, "--tls-cert and --tls-key go together: set both or neither")
    if tls.client_ca and not tls.cert:
        raise ConfigError("tls_client_ca", "mutual TLS needs --tls-cert and --tls-key as well")
    if tls.cert and not tcp:
        raise ConfigError("tls_cert", "set, but --tcp is empty: TLS applies to the TCP listener only")
    if tcp and values.get_str("tokens_file") and not tls.cert and not values["allow_plaintext_tcp"]:
        raise ConfigError(
            "allow_plaintext_tcp",
            f"refusing a plaintext TCP listener on {tcp} with a tokens file: bearer tokens would cross "
            "the network in clear text; set --tls-cert and --tls-key, or --allow-plaintext-tcp to accept that",
        )
    if (
        tcp
        and not values.get_str("tokens_file")
        and not tls.mutual
        and not values["allow_unauthenticated_tcp"]
    ):
        raise ConfigError(
            "allow_unauthenticated_tcp",
            f"refusing a TCP listener on {tcp} without a tokens file (nor mutual TLS): anyone who can reach it "
            "could read and write the cache; set --tokens-file, or --allow-unauthenticated-tcp to accept that",
        )
    return tls
