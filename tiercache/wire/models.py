"""The core's shared value types and their ``tiercache.v1`` messages, in both directions.

Every conversion from the wire validates what it converts and raises
:class:`~tiercache.errors.InvalidArgumentError` naming the field by its path, rooted at the ``field`` the
caller passes (``namespace.layout.dtype``, ``prefill.tokens_per_s``), so that a daemon answering a request
and a connector reading a response name the same field the same way.

Primitives:
    layout_to_proto, layout_from_proto: KVLayout <-> ``Layout``.
    namespace_to_proto, namespace_from_proto: Namespace <-> ``NamespaceSpec`` (a size of 0, unset in proto3,
        means 1).
    prefill_to_proto, prefill_from_proto: PrefillModel <-> ``PrefillModel``.
    deadline_to_proto, deadline_from_proto: DeadlineModel <-> ``DeadlineModel`` (no cap travels as 0).
"""

from __future__ import annotations

import math

from tiercache.errors import InvalidArgumentError
from tiercache.keys import Namespace
from tiercache.layout import KVLayout
from tiercache.policies.load import DeadlineModel, PrefillModel
from tiercache.proto import tiercache_pb2 as pb

from .enums import DTYPES


def _under(field: str, exc: InvalidArgumentError) -> InvalidArgumentError:
    """``exc`` re-rooted under ``field``: ``num_layers: ...`` becomes ``layout.num_layers: ...``."""
    text = str(exc)
    message = text.removeprefix(f"{exc.field}: ")
    return InvalidArgumentError(f"{field}.{exc.field}", message)


def _finite(value: float, field: str, positive: bool = False) -> float:
    ok = math.isfinite(value) and (value > 0 if positive else value >= 0)
    if not ok:
        want = "> 0" if positive else ">= 0"
        raise InvalidArgumentError(field, f"must be a finite number {want}, got {value!r}")
    return float(value)


def layout_to_proto(layout: KVLayout) -> pb.Layout:
    """The ``Layout`` message of a KV layout."""
    return pb.Layout(
        num_layers=layout.num_layers,
        num_kv_heads=layout.num_kv_heads,
        head_dim=layout.head_dim,
        dtype=DTYPES.to_proto(layout.dtype),
        chunk_tokens=layout.chunk_tokens,
        page_tokens=layout.page_tokens,
        mla=layout.mla,
    )


def layout_from_proto(msg: pb.Layout, field: str = "layout") -> KVLayout:
    """The KV layout of a ``Layout`` message.

    Raises:
        InvalidArgumentError: naming the field under ``field``, e.g. ``layout.dtype`` (unspecified or
            unknown) or ``layout.chunk_tokens`` (not a multiple of the page).
    """
    dtype = DTYPES.from_proto(int(msg.dtype), f"{field}.dtype")
    try:
        return KVLayout(
            num_layers=msg.num_layers,
            num_kv_heads=msg.num_kv_heads,
            head_dim=msg.head_dim,
            dtype=dtype,
            chunk_tokens=msg.chunk_tokens,
            page_tokens=msg.page_tokens,
            mla=msg.mla,
        )
    except InvalidArgumentError as exc:
        raise _under(field, exc) from None


def namespace_to_proto(namespace: Namespace) -> pb.NamespaceSpec:
    """The ``NamespaceSpec`` message of a namespace."""
    return pb.NamespaceSpec(
        model_id=namespace.model_id,
        revision=namespace.revision,
        layout=layout_to_proto(namespace.layout),
        tokenizer_id=namespace.tokenizer_id,
        tp_rank=namespace.tp_rank,
        tp_size=namespace.tp_size,
        pp_rank=namespace.pp_rank,
        pp_size=namespace.pp_size,
        adapter_id=namespace.adapter_id,
        cache_salt=namespace.cache_salt,
    )


def namespace_from_proto(msg: pb.NamespaceSpec, field: str = "namespace") -> Namespace:
    """The namespace of a ``NamespaceSpec``.

    ``tp_size`` and ``pp_size`` of 0 (unset in proto3) mean 1; every other field is taken as sent.

    Raises:
        InvalidArgumentError: naming the field under ``field``, e.g. ``namespace.layout: is required``,
            ``namespace.layout.dtype`` or ``namespace.tp_rank``.
    """
    if not msg.HasField("layout"):
        raise InvalidArgumentError(f"{field}.layout", "is required")
    layout = layout_from_proto(msg.layout, f"{field}.layout")
    try:
        return Namespace(
            model_id=msg.model_id,
            revision=msg.revision,
            layout=layout,
            tokenizer_id=msg.tokenizer_id,
            tp_rank=msg.tp_rank,
            tp_size=msg.tp_size or 1,
            pp_rank=msg.pp_rank,
            pp_size=msg.pp_size or 1,
            adapter_id=msg.adapter_id,
            cache_salt=msg.cache_salt,
        )
    except InvalidArgumentError as exc:
        raise _under(field, exc) from None


def prefill_to_proto(model: PrefillModel) -> pb.PrefillModel:
    """The ``PrefillModel`` message of an engine's prefill model."""
    return pb.PrefillModel(tokens_per_s=model.tokens_per_s, quadratic_s=model.quadratic_s)


def prefill_from_proto(msg: pb.PrefillModel, field: str = "prefill") -> PrefillModel:
    """The prefill model of a ``PrefillModel`` message.

    Raises:
        InvalidArgumentError: ``prefill.tokens_per_s`` not a finite positive number, or
            ``prefill.quadratic_s`` not a finite number >= 0.
    """
    return PrefillModel(
        tokens_per_s=_finite(msg.tokens_per_s, f"{field}.tokens_per_s", positive=True),
        quadratic_s=_finite(msg.quadratic_s, f"{field}.quadratic_s"),
    )


def deadline_to_proto(model: DeadlineModel) -> pb.DeadlineModel:
    """The ``DeadlineModel`` message of a deadline model (an infinite cap travels as 0: none)."""
    cap = model.cap_s if math.isfinite(model.cap_s) else 0.0
    return pb.DeadlineModel(base_s=model.base_s, per_1k_tokens_s=model.per_1k_tokens_s, cap_s=cap)


def deadline_from_proto(msg: pb.DeadlineModel, field: str = "deadline") -> DeadlineModel:
    """The deadline model of a ``DeadlineModel`` message (``cap_s`` 0: no cap).

    Raises:
        InvalidArgumentError: a negative or non-finite term, naming it (``deadline.base_s``).
    """
    base = _finite(msg.base_s, f"{field}.base_s")
    per_1k = _finite(msg.per_1k_tokens_s, f"{field}.per_1k_tokens_s")
    cap = _finite(msg.cap_s, f"{field}.cap_s")
    return DeadlineModel(base_s=base, per_1k_tokens_s=per_1k, cap_s=cap or float("inf"))
