"""Conversions between core values and their ``tiercache.v1`` messages.

Primitives:
    dtype_to_proto / dtype_from_proto: KVDtype <-> the wire enum.
    codec_to_proto: Codec -> the wire enum.
    layout_to_proto / layout_from_proto: KVLayout <-> ``Layout``.
    namespace_to_proto: Namespace -> ``NamespaceSpec``.
    prefill_to_proto, deadline_to_proto: the engine's cost models -> ``PrefillModel`` / ``DeadlineModel``.
"""

from __future__ import annotations

import math

from tiercache.codec import Codec
from tiercache.errors import InvalidArgumentError
from tiercache.keys import Namespace
from tiercache.layout import KVDtype, KVLayout
from tiercache.policies.load import DeadlineModel, PrefillModel
from tiercache.proto import tiercache_pb2 as pb

_DTYPES: dict[KVDtype, pb.KVDtype] = {
    KVDtype.FLOAT32: pb.KV_DTYPE_FLOAT32,
    KVDtype.FLOAT16: pb.KV_DTYPE_FLOAT16,
    KVDtype.BFLOAT16: pb.KV_DTYPE_BFLOAT16,
    KVDtype.FP8_E4M3: pb.KV_DTYPE_FP8_E4M3,
    KVDtype.FP8_E5M2: pb.KV_DTYPE_FP8_E5M2,
    KVDtype.INT8: pb.KV_DTYPE_INT8,
}
_DTYPES_BACK: dict[int, KVDtype] = {int(v): k for k, v in _DTYPES.items()}


_CODECS: dict[Codec, pb.Codec] = {Codec.RAW: pb.CODEC_RAW, Codec.ZSTD: pb.CODEC_ZSTD}


def codec_to_proto(codec: Codec) -> pb.Codec:
    """The wire enum of a codec."""
    return _CODECS[codec]


def dtype_to_proto(dtype: KVDtype) -> pb.KVDtype:
    """The wire enum of a KV dtype."""
    return _DTYPES[dtype]


def dtype_from_proto(value: int) -> KVDtype:
    """The KV dtype of a wire enum value.

    Raises:
        InvalidArgumentError: naming ``layout.dtype``, for an unspecified or unknown value.
    """
    try:
        return _DTYPES_BACK[int(value)]
    except KeyError:
        raise InvalidArgumentError("layout.dtype", f"unknown KV dtype {value}") from None


def layout_to_proto(layout: KVLayout) -> pb.Layout:
    """The ``Layout`` message of a KV layout."""
    return pb.Layout(
        num_layers=layout.num_layers,
        num_kv_heads=layout.num_kv_heads,
        head_dim=layout.head_dim,
        dtype=dtype_to_proto(layout.dtype),
        chunk_tokens=layout.chunk_tokens,
        page_tokens=layout.page_tokens,
        mla=layout.mla,
    )


def layout_from_proto(msg: pb.Layout) -> KVLayout:
    """The KV layout of a ``Layout`` message.

    Raises:
        InvalidArgumentError: the message describes no valid layout.
    """
    return KVLayout(
        num_layers=msg.num_layers,
        num_kv_heads=msg.num_kv_heads,
        head_dim=msg.head_dim,
        dtype=dtype_from_proto(msg.dtype),
        chunk_tokens=msg.chunk_tokens,
        page_tokens=msg.page_tokens,
        mla=msg.mla,
    )


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


def prefill_to_proto(model: PrefillModel) -> pb.PrefillModel:
    """The ``PrefillModel`` message of an engine's prefill model."""
    return pb.PrefillModel(tokens_per_s=model.tokens_per_s, quadratic_s=model.quadratic_s)


def deadline_to_proto(model: DeadlineModel) -> pb.DeadlineModel:
    """The ``DeadlineModel`` message of a deadline model (an infinite cap travels as 0: none)."""
    cap = model.cap_s if math.isfinite(model.cap_s) else 0.0
    return pb.DeadlineModel(base_s=model.base_s, per_1k_tokens_s=model.per_1k_tokens_s, cap_s=cap)
