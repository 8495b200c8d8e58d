"""Daemon addresses, gRPC channel options and per-call credentials.

Addresses: ``unix:/path``, ``unix:///path``, a bare filesystem path (``/run/tc.sock``, ``./tc.sock``),
``host:port``, ``tcp://host:port`` and ``[v6addr]:port``.

Primitives:
    Endpoint: a parsed address (``target`` is what gRPC dials).
    parse_address: parse and validate an address string.
    ChannelConfig: message size limits, reconnect timing and TLS of a channel.
    open_channel: a ``grpc.Channel`` to an endpoint (TLS on TCP when the config says so).
    auth_metadata: the ``authorization: Bearer <token>`` call metadata (empty without a token).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import grpc

from tiercache.errors import InvalidArgumentError

from .config import ClientTls

_UNIX = "unix:"
_TCP = "tcp://"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A parsed daemon address.

    Attributes:
        target: the gRPC target string (``unix:/abs/path`` or ``host:port``).
        unix_path: the socket path for a unix-socket endpoint, else None.
        host: the host of a TCP endpoint (without brackets), else None.
        port: the port of a TCP endpoint, else None.
    """

    target: str
    unix_path: str | None = None
    host: str | None = None
    port: int | None = None

    @property
    def is_unix(self) -> bool:
        """True for a unix-socket endpoint."""
        return self.unix_path is not None


def _unix(path: str, address: str) -> Endpoint:
    if not path or "\x00" in path:
        raise InvalidArgumentError("address", f"{address!r} names no socket path")
    absolute = os.path.abspath(path)
    return Endpoint(target=_UNIX + absolute, unix_path=absolute)


def _tcp(hostport: str, address: str) -> Endpoint:
    if hostport.startswith("["):
        host, sep, rest = hostport[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise InvalidArgumentError("address", f"{address!r}: expected [v6addr]:port")
        port_text = rest[1:]
        target_host = f"[{host}]"
    else:
        host, sep, port_text = hostport.rpartition(":")
        if not sep or ":" in host:
            raise InvalidArgumentError("address", f"{address!r}: expected host:port (or unix:/path)")
        target_host = host
    if not host or any(c in host for c in "/ @?#"):
        raise InvalidArgumentError("address", f"{address!r}: bad host {host!r}")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise InvalidArgumentError("address", f"{address!r}: port must be in [1, 65535], got {port_text!r}")
    port = int(port_text)
    return Endpoint(target=f"{target_host}:{port}", host=host, port=port)


def parse_address(address: str) -> Endpoint:
    """Parse a daemon address.

    Args:
        address: ``unix:/path``, ``unix:///path``, ``/path``, ``./path``, ``host:port``, ``tcp://host:port``
            or ``[v6addr]:port``.

    Returns:
        The endpoint.

    Raises:
        InvalidArgumentError: naming ``address``, when it is none of these.
    """
    if not isinstance(address, str) or not address.strip():
        raise InvalidArgumentError("address", f"must be a non-empty string, got {address!r}")
    text = address.strip()
    if text.startswith(_UNIX):
        path = text[len(_UNIX) :]
        if path.startswith("//"):
            # unix://<authority>/path: only an empty authority (unix:///abs/path) is meaningful.
            authority, slash, rest = path[2:].partition("/")
            if authority or not slash:
                raise InvalidArgumentError("address", f"{address!r}: use unix:/abs/path or unix:///abs/path")
            path = "/" + rest
        return _unix(path, address)
    if text.startswith(_TCP):
        return _tcp(text[len(_TCP) :].rstrip("/"), address)
    if "://" in text:
        raise InvalidArgumentError("address", f"{address!r}: unknown scheme (use unix: or tcp://)")
    if text.startswith(("/", "./", "../", "~")):
        return _unix(os.path.expanduser(text), address)
    return _tcp(text, address)


@dataclass(frozen=True, slots=True)
class ChannelConfig:
    """Options of the channel to the daemon.

    Attributes:
        max_message_bytes: largest message sent or received (a stream message is far smaller).
        connect_backoff_s: gRPC's initial / minimum reconnect backoff.
        max_connect_backoff_s: gRPC's reconnect backoff ceiling (keep it short so that a restarted daemon
            is found again quickly).
        keepalive_s: interval of keepalive pings on TCP (0: off).
        tls: TLS of a TCP channel (None: plaintext); needed for a daemon whose TCP listener speaks TLS,
            which it does whenever it has tokens (unless its operator allowed plaintext).
    """

    max_message_bytes: int = 64 * 1024 * 1024
    connect_backoff_s: float = 0.05
    max_connect_backoff_s: float = 1.0
    keepalive_s: float = 0.0
    tls: ClientTls | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max_message_bytes, bool) or self.max_message_bytes <= 0:
            raise InvalidArgumentError("max_message_bytes", f"must be > 0, got {self.max_message_bytes!r}")
        if not 0 < self.connect_backoff_s <= self.max_connect_backoff_s:
            raise InvalidArgumentError(
                "connect_backoff_s",
                f"need 0 < connect_backoff_s <= max_connect_backoff_s, got {self.connect_backoff_s!r}"
                f" and {self.max_connect_backoff_s!r}",
            )
        if not self.keepalive_s >= 0:
            raise InvalidArgumentError("keepalive_s", f"must be >= 0, got {self.keepalive_s!r}")
        if self.tls is not None and not isinstance(self.tls, ClientTls):
            raise InvalidArgumentError("tls", f"must be a ClientTls or None, got {self.tls!r}")

    def options(self) -> list[tuple[str, int]]:
        """The gRPC channel arguments."""
        backoff_ms = max(1, int(self.connect_backoff_s * 1000))
        opts = [
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.initial_reconnect_backoff_ms", backoff_ms),
            ("grpc.min_reconnect_backoff_ms", backoff_ms),
            ("grpc.max_reconnect_backoff_ms", max(backoff_ms, int(self.max_connect_backoff_s * 1000))),
            ("grpc.enable_retries", 0),
        ]
        if self.keepalive_s > 0:
            opts.append(("grpc.keepalive_time_ms", int(self.keepalive_s * 1000)))
        return opts


def open_channel(endpoint: Endpoint, config: ChannelConfig) -> grpc.Channel:
    """A channel to ``endpoint``: TLS on TCP when ``config.tls`` is set, else plaintext (a unix socket is
    protected by its file mode and never carries TLS).

    The channel connects lazily: a daemon that is down makes the first call fail, not this one.

    Raises:
        InvalidArgumentError: naming the ``tls`` field, when a TLS file cannot be read.
    """
    if config.tls is None or endpoint.is_unix:
        return grpc.insecure_channel(endpoint.target, options=config.options())
    options: list[tuple[str, int | str]] = [*config.options()]
    if config.tls.server_name:
        options.append(("grpc.ssl_target_name_override", config.tls.server_name))
    return grpc.secure_channel(endpoint.target, config.tls.credentials(), options=options)


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying ``token`` as a bearer token (empty without one).

    Raises:
        InvalidArgumentError: naming ``token``, when it is empty or holds whitespace or control characters.
    """
    if token is None:
        return ()
    if not isinstance(token, str) or not token or any(c.isspace() or ord(c) < 32 for c in token):
        raise InvalidArgumentError("token", "must be a non-empty string without whitespace")
    return (("authorization", f"Bearer {token}"),)
