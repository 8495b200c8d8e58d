"""Per-request control of the connector through vLLM's ``kv_transfer_params``.

A request can turn tiercache off for itself, as LMCache's ``caching: false`` does: vLLM hands the connector
the request's ``kv_transfer_params`` (``SamplingParams.extra_args["kv_transfer_params"]``; in the OpenAI
server, the request body's ``kv_transfer_params`` object). Keys (all optional, booleans):

    tiercache_skip_load: true: do not look the prompt up in tiercache (no daemon call; vLLM computes
        whatever its own prefix cache does not hold).
    tiercache_skip_save: true: do not store the request's chunks in tiercache.

Other keys belong to other connectors and are ignored. vLLM gives a connector no way to fail one request
(an exception in the scheduler would stop the whole engine), so a bad value — not a boolean, or an unknown
``tiercache_*`` key — is logged as a warning naming the key, and the request runs with the default (load and
save).

Primitives:
    RequestParams: what one request asked for (a frozen dataclass).
    request_params: read them from a vLLM ``Request``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

SKIP_LOAD = "tiercache_skip_load"
SKIP_SAVE = "tiercache_skip_save"
_PREFIX = "tiercache_"


@dataclass(frozen=True, slots=True)
class RequestParams:
    """A request's choices.

    Attributes:
        load: look the prompt up and load what tiercache holds.
        save: store the chunks the engine computes.
    """

    load: bool = True
    save: bool = True


DEFAULT = RequestParams()


def request_params(request: Any) -> RequestParams:
    """The tiercache choices in ``request.kv_transfer_params`` (the defaults, with a warning naming the key,
    for a bad value)."""
    given = getattr(request, "kv_transfer_params", None)
    if not given:
        return DEFAULT
    req_id = getattr(request, "request_id", "?")
    if not isinstance(given, dict):
        logger.warning(
            "request %s: kv_transfer_params must be an object, got %r; tiercache loads and saves",
            req_id,
            type(given).__name__,
        )
        return DEFAULT
    choices = {SKIP_LOAD: False, SKIP_SAVE: False}
    for key, value in given.items():
        if not isinstance(key, str) or not key.startswith(_PREFIX):
            continue  # another connector's
        if key not in choices:
            logger.warning(
                "request %s: kv_transfer_params.%s is not a tiercache key (valid: %s); tiercache loads"
                " and saves",
                req_id,
                key,
                ", ".join(choices),
            )
            return DEFAULT
        if not isinstance(value, bool):
            logger.warning(
                "request %s: kv_transfer_params.%s must be true or false, got %r; tiercache loads and saves",
                req_id,
                key,
                value,
            )
            return DEFAULT
        choices[key] = value
    return RequestParams(load=not choices[SKIP_LOAD], save=not choices[SKIP_SAVE])
