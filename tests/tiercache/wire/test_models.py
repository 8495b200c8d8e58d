"""KVLayout, Namespace, PrefillModel and DeadlineModel on the wire: every valid value round trips (through the
serialized bytes too), and a message that describes no valid value fails naming the field by its path."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tiercache.errors import InvalidArgumentError
from tiercache.keys import Namespace
from tiercache.layout import KVDtype, KVLayout
from tiercache.policies.load import DeadlineModel, PrefillModel
from tiercache.proto import tiercache_pb2 as pb
from tiercache.wire import (
    deadline_from_proto,
    deadline_to_proto,
    layout_from_proto,
    layout_to_proto,
    namespace_from_proto,
    namespace_to_proto,
    prefill_from_proto,
    prefill_to_proto,
)

LAYOUT = KVLayout(
    num_layers=2, num_kv_heads=2, head_dim=8, dtype=KVDtype.FLOAT16, chunk_tokens=16, page_tokens=4
)


@st.composite
def layouts(draw: st.DrawFn) -> KVLayout:
    mla = draw(st.booleans())
    page = draw(st.integers(1, 64))
    return KVLayout(
        num_layers=draw(st.integers(1, 128)),
        num_kv_heads=1 if mla else draw(st.integers(1, 64)),
        head_dim=draw(st.integers(1, 1024)),
        dtype=draw(st.sampled_from(KVDtype)),
        chunk_tokens=page * draw(st.integers(1, 32)),
        page_tokens=page,
        mla=mla,
    )


@st.composite
def namespaces(draw: st.DrawFn) -> Namespace:
    tp, pp = draw(st.integers(1, 8)), draw(st.integers(1, 8))
    return Namespace(
        model_id=draw(st.text(min_size=1, max_size=40)),
        revision=draw(st.text(max_size=40)),
        layout=draw(layouts()),
        tokenizer_id=draw(st.text(max_size=20)),
        tp_rank=draw(st.integers(0, tp - 1)),
        tp_size=tp,
        pp_rank=draw(st.integers(0, pp - 1)),
        pp_size=pp,
        adapter_id=draw(st.text(max_size=20)),
        cache_salt=draw(st.text(max_size=20)),
    )


_finite = st.floats(min_value=0, max_value=1e12, allow_nan=False, allow_infinity=False)


@given(layouts())
def test_layouts_round_trip(layout: KVLayout) -> None:
    msg = pb.Layout.FromString(layout_to_proto(layout).SerializeToString())
    assert layout_from_proto(msg) == layout


@given(namespaces())
def test_namespaces_round_trip_and_keep_their_root(namespace: Namespace) -> None:
    msg = pb.NamespaceSpec.FromString(namespace_to_proto(namespace).SerializeToString())
    back = namespace_from_proto(msg)
    assert back == namespace
    assert back.encode() == namespace.encode()


@given(_finite.filter(lambda v: v > 0), _finite)
def test_prefill_models_round_trip(tokens_per_s: float, quadratic_s: float) -> None:
    model = PrefillModel(tokens_per_s=tokens_per_s, quadratic_s=quadratic_s)
    assert (
        prefill_from_proto(pb.PrefillModel.FromString(prefill_to_proto(model).SerializeToString())) == model
    )


@given(_finite, _finite, st.one_of(_finite.filter(lambda v: v > 0), st.just(math.inf)))
def test_deadline_models_round_trip(base_s: float, per_1k_tokens_s: float, cap_s: float) -> None:
    model = DeadlineModel(base_s=base_s, per_1k_tokens_s=per_1k_tokens_s, cap_s=cap_s)
    msg = pb.DeadlineModel.FromString(deadline_to_proto(model).SerializeToString())
    assert deadline_from_proto(msg) == model


def test_no_cap_travels_as_zero() -> None:
    assert deadline_to_proto(DeadlineModel(base_s=0.1)).cap_s == 0.0
    assert deadline_from_proto(pb.DeadlineModel(base_s=0.1)).cap_s == math.inf


def test_unset_sizes_mean_one() -> None:
    spec = pb.NamespaceSpec(model_id="m", layout=layout_to_proto(LAYOUT))
    ns = namespace_from_proto(spec)
    assert (ns.tp_rank, ns.tp_size, ns.pp_rank, ns.pp_size) == (0, 1, 0, 1)


def _spec(**changes: object) -> pb.NamespaceSpec:
    spec = namespace_to_proto(Namespace(model_id="m", revision="r", layout=LAYOUT))
    for path, value in changes.items():
        target: object = spec
        *parents, leaf = path.split("__")
        for parent in parents:
            target = getattr(target, parent)
        setattr(target, leaf, value)
    return spec


def _no_layout() -> pb.NamespaceSpec:
    spec = _spec()
    spec.ClearField("layout")
    return spec


@pytest.mark.parametrize(
    ("convert", "field", "message"),
    [
        (
            lambda: namespace_from_proto(_spec(layout__dtype=pb.KV_DTYPE_UNSPECIFIED)),
            "namespace.layout.dtype",
            "0 is not a KV dtype; valid: KV_DTYPE_FLOAT32, KV_DTYPE_FLOAT16, KV_DTYPE_BFLOAT16, "
            "KV_DTYPE_FP8_E4M3, KV_DTYPE_FP8_E5M2, KV_DTYPE_INT8",
        ),
        (
            lambda: namespace_from_proto(_spec(layout__dtype=42)),
            "namespace.layout.dtype",
            "42 is not a KV dtype; valid: KV_DTYPE_FLOAT32, KV_DTYPE_FLOAT16, KV_DTYPE_BFLOAT16, "
            "KV_DTYPE_FP8_E4M3, KV_DTYPE_FP8_E5M2, KV_DTYPE_INT8",
        ),
        (
            lambda: namespace_from_proto(_spec(layout__page_tokens=5)),
            "namespace.layout.chunk_tokens",
            "16 is not a positive multiple of page_tokens=5",
        ),
        (
            lambda: namespace_from_proto(_spec(layout__num_layers=0)),
            "namespace.layout.num_layers",
            "must be a positive integer, got 0",
        ),
        (lambda: namespace_from_proto(_no_layout()), "namespace.layout", "is required"),
        (lambda: namespace_from_proto(_spec(tp_rank=3)), "namespace.tp_rank", "3 not in [0, 1)"),
        (
            lambda: namespace_from_proto(_spec(model_id=""), "register.namespace"),
            "register.namespace.model_id",
            "must be a non-empty string, got ''",
        ),
        (
            lambda: layout_from_proto(pb.Layout()),
            "layout.dtype",
            "0 is not a KV dtype; valid: KV_DTYPE_FLOAT32",
        ),
        (
            lambda: prefill_from_proto(pb.PrefillModel(tokens_per_s=0.0)),
            "prefill.tokens_per_s",
            "must be a finite number > 0, got 0.0",
        ),
        (
            lambda: prefill_from_proto(pb.PrefillModel(tokens_per_s=math.inf)),
            "prefill.tokens_per_s",
            "must be a finite number > 0, got inf",
        ),
        (
            lambda: prefill_from_proto(pb.PrefillModel(tokens_per_s=1.0, quadratic_s=-1.0)),
            "prefill.quadratic_s",
            "must be a finite number >= 0, got -1.0",
        ),
        (
            lambda: deadline_from_proto(pb.DeadlineModel(base_s=-0.5)),
            "deadline.base_s",
            "must be a finite number >= 0, got -0.5",
        ),
        (
            lambda: deadline_from_proto(pb.DeadlineModel(per_1k_tokens_s=math.nan)),
            "deadline.per_1k_tokens_s",
            "must be a finite number >= 0, got nan",
        ),
        (
            lambda: deadline_from_proto(pb.DeadlineModel(cap_s=math.inf)),
            "deadline.cap_s",
            "must be a finite number >= 0, got inf",
        ),
    ],
)
def test_a_bad_message_fails_naming_the_field(
    convert: Callable[[], object], field: str, message: str
) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        convert()
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: {message}")
