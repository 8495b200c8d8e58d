"""TLS of the daemon's TCP listener: certificate, key and the optional client CA of mutual TLS.

Bearer tokens travel in call metadata, so on TCP they are only as safe as the transport: with a tokens file
and a TCP listener the daemon wants TLS (``tls_cert`` + ``tls_key``), and starts a plaintext TCP listener
only when the operator says so explicitly (``allow_plaintext_tcp``; checked in
:meth:`~tiercache.daemon.config.DaemonConfig.from_values`). With ``tls_client_ca`` the listener demands a
client certificate signed by that CA (mutual TLS) on top of the token. The unix socket stays plaintext: it is
protected by its file mode and never leaves the host.

Primitives:
    TlsConfig: the three file paths (the ``tls_*`` options); ``enabled``, ``mutual``.
    server_credentials: the ``grpc.ServerCredentials`` of a config (files read once, at start).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import grpc

from tiercache.options import option
from tiercache.parsers import parse_str

from .listen import StartupError

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """TLS files of the TCP listener (PEM). Empty strings: not set.

    Attributes:
        cert: the server's certificate chain.
        key: the server's private key.
        client_ca: CA certificates that sign the clients' certificates; set: mutual TLS is required.
    """

    cert: str = option(
        "tls_cert",
        parse=parse_str,
        help="PEM certificate chain of the TCP listener: with --tls-key, TCP speaks TLS",
        metavar="PATH",
        default="",
        note="off",
    )
    key: str = option(
        "tls_key",
        parse=parse_str,
        help="PEM private key of --tls-cert",
        metavar="PATH",
        default="",
        note="off",
    )
    client_ca: str = option(
        "tls_client_ca",
        parse=parse_str,
        help="PEM CA certificates of the clients: set, TCP clients must present a certificate it signed "
        "(mutual TLS)",
        metavar="PATH",
        default="",
        note="off",
    )

    @property
    def enabled(self) -> bool:
        """Whether the TCP listener speaks TLS."""
        return bool(self.cert)

    @property
    def mutual(self) -> bool:
        """Whether clients must present a certificate signed by ``client_ca``."""
        return bool(self.client_ca)


def _read(path: str, option: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise StartupError(
            f"--{option.replace('_', '-')}: cannot read {path}: {exc.strerror or exc}"
        ) from None
    if b"-----BEGIN " not in data:
        raise StartupError(f"--{option.replace('_', '-')}: {path} holds no PEM block")
    return data


def server_credentials(config: TlsConfig) -> grpc.ServerCredentials:
    """The server credentials of ``config`` (which must be enabled).

    Raises:
        StartupError: naming the option, when a file cannot be read or holds no PEM block.
    """
    cert = _read(config.cert, "tls_cert")
    key = _read(config.key, "tls_key")
    client_ca = _read(config.client_ca, "tls_client_ca") if config.mutual else None
    logger.info(
        "TCP listener uses TLS (%s)", "mutual: client certificates required" if client_ca else "server"
    )
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )
