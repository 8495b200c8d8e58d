"""Bearer-token authentication: which tenant a call comes from.

The tokens file is TOML with one table, ``[tokens]``, mapping token strings to tenant names::

    [tokens]
    "s3cr3t-token-of-team-a" = "team-a"
    "another-token" = "team-b"

Without a tokens file every caller is the default tenant ``""``. With one, every call (health checks
excepted) carries the metadata ``authorization: Bearer <token>``.

The operator's token (``admin_token_file``: a file holding one token) is not a tenant's: it opens the views
of the whole cache — ``/metrics`` (unless ``metrics_public``) and, with a tokens file, cache-wide ``Stats``.
With a tokens file its calls are those of a tenant of their own, :data:`OPERATOR` (a name no tokens file
can give), so it never sees or touches a tenant's namespaces through a handle. Tokens are kept as SHA-256 digests only.
The same file may hold the tenants' quotas (``[quotas.*]`` tables, read by :mod:`.limits`); a tenant over
its RPC rate is refused here, right after its token is checked.

Primitives:
    UnauthenticatedError: a missing, malformed or unknown token (gRPC ``UNAUTHENTICATED``).
    load_tokens: read a tokens file into a token-digest -> tenant map.
    load_admin_token: read the operator's token file into its digest.
    OPERATOR: the tenant of the operator's token.
    Authenticator: ``tenant(metadata)`` for every call (the RPC rate limit applied); ``identify(metadata)``
        the same without the rate limit (a connection's credentials, checked once); ``enabled`` tells
        whether tokens are checked.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import stat
import sys
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from tiercache.errors import PermissionDeniedError

from .config import ConfigError
from .limits import RateLimiter

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

logger = logging.getLogger(__name__)

METADATA_KEY = "authorization"
"""gRPC metadata key carrying the token (lower case, as gRPC delivers it)."""
SCHEME = "bearer"
"""The only accepted authorization scheme (case-insensitive)."""
DEFAULT_TENANT = ""
"""The tenant of every caller when authentication is off."""
OPERATOR = "<operator>"
"""The tenant of the operator's token (a tokens file cannot name a tenant so)."""


class UnauthenticatedError(PermissionDeniedError):
    """The call carries no valid credentials (missing, malformed or unknown bearer token)."""


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


def load_tokens(path: str) -> Mapping[bytes, str]:
    """Read a tokens file.

    Returns:
        SHA-256 digest of each token -> tenant name.

    Raises:
        ConfigError: naming ``tokens_file``, when the file is unreadable or malformed.
    """
    try:
        with open(path, "rb") as fh:
            mode = os.fstat(fh.fileno()).st_mode
            table = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError("tokens_file", f"cannot read {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("tokens_file", f"{path} is not valid TOML: {exc}") from None
    extra = sorted(set(table) - {"tokens", "quotas"})
    if extra:
        raise ConfigError(
            "tokens_file", f"{path}: unknown key(s) {extra}; expected one [tokens] table (and [quotas.*])"
        )
    tokens = table.get("tokens")
    if not isinstance(tokens, dict) or not tokens:
        raise ConfigError("tokens_file", f'{path}: needs a non-empty [tokens] table of "token" = "tenant"')
    out: dict[bytes, str] = {}
    for token, tenant in tokens.items():
        if not token.strip() or any(c.isspace() for c in token):
            raise ConfigError("tokens_file", f"{path}: a token is empty or contains whitespace")
        if not isinstance(tenant, str) or not tenant:
            raise ConfigError("tokens_file", f"{path}: the tenant of a token must be a non-empty string")
        if tenant == OPERATOR:
            raise ConfigError(
                "tokens_file", f"{path}: {OPERATOR!r} is the operator's; name the tenant otherwise"
            )
        out[_digest(token)] = tenant
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        logger.warning("tokens file %s is readable by other users (mode %o)", path, stat.S_IMODE(mode))
    logger.info("loaded %d token(s) for %d tenant(s) from %s", len(out), len(set(out.values())), path)
    return MappingProxyType(out)


def load_admin_token(path: str) -> bytes:
    """Read the operator's token file (its one line, stripped).

    Returns:
        The token's SHA-256 digest.

    Raises:
        ConfigError: naming ``admin_token_file``, when the file is unreadable, empty or holds whitespace.
    """
    try:
        with open(path, "rb") as fh:
            mode = os.fstat(fh.fileno()).st_mode
            token = fh.read(4096).decode("utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("admin_token_file", f"cannot read {path}: {exc}") from None
    if not token or any(c.isspace() for c in token):
        raise ConfigError("admin_token_file", f"{path}: must hold one token (no whitespace inside)")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        logger.warning("admin token file %s is readable by other users (mode %o)", path, stat.S_IMODE(mode))
    return _digest(token)


class Authenticator:
    """Maps the metadata of a call to its tenant."""

    def __init__(
        self,
        tokens: Mapping[bytes, str] | None,
        limiter: RateLimiter | None = None,
        operator: bytes | None = None,
    ) -> None:
        """Args: tokens: token digest -> tenant (from :func:`load_tokens`), None turns authentication off;
        limiter: the tenants' RPC rate limit (None: none); operator: the digest of the operator's token
        (:func:`load_admin_token`; None: no operator)."""
        self._tokens = tokens
        self._limiter = limiter
        self._operator = operator

    @property
    def enabled(self) -> bool:
        """Whether calls must carry a token."""
        return self._tokens is not None

    def tenant(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
        """The tenant of a call.

        Args:
            metadata: the call's invocation metadata (key, value) pairs.

        Raises:
            UnauthenticatedError: authentication is on and the token is missing, malformed or unknown.
            QuotaExceededError: the tenant is over its RPC rate (``rpc_rate``).
        """
        tenant = self.identify(metadata)
        if self._limiter is not None:
            self._limiter.admit(tenant)
        return tenant

    def identify(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
        """The tenant of ``metadata``'s token, without counting a call against its rate.

        Raises:
            UnauthenticatedError: authentication is on and the token is missing, malformed or unknown.
        """
        if self._tokens is None:
            return DEFAULT_TENANT
        digest = _digest(self._token(metadata))
        if self._operator is not None and hmac.compare_digest(digest, self._operator):
            return OPERATOR
        tenant = self._tokens.get(digest)
        if tenant is None:
            raise UnauthenticatedError(f"{METADATA_KEY}: unknown token")
        return tenant

    def cache_wide(self, tenant: str) -> bool:
        """Whether ``tenant``'s views are of the whole cache: the operator's, or everyone's without tokens."""
        return self._tokens is None or tenant == OPERATOR

    def is_operator_header(self, value: str) -> bool:
        """Whether an HTTP ``Authorization`` header carries the operator's token (False without one)."""
        if self._operator is None:
            return False
        scheme, _, token = value.strip().partition(" ")
        if scheme.lower() != SCHEME or not token.strip():
            return False
        return hmac.compare_digest(_digest(token.strip()), self._operator)

    @staticmethod
    def _token(metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
        values = [v for k, v in (metadata or ()) if k.lower() == METADATA_KEY]
        if not values:
            raise UnauthenticatedError(
                f"{METADATA_KEY}: missing; this daemon needs the metadata '{METADATA_KEY}: Bearer <token>'"
            )
        value = values[0].decode("utf-8", "replace") if isinstance(values[0], bytes) else values[0]
        scheme, _, token = value.strip().partition(" ")
        if scheme.lower() != SCHEME or not token.strip():
            raise UnauthenticatedError(f"{METADATA_KEY}: expected 'Bearer <token>'")
        return token.strip()
