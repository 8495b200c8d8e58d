"""What the SGLang backend refuses, naming the field, before it serves anything: bad extra-config keys and
values (through SGLang's own factory, so SGLang's attach fails), host pools it does not move; and what its
namespace keeps apart and shares."""

from __future__ import annotations

from typing import Any

import pytest

from tiercache.connector.config import DataPlaneMode
from tiercache.errors import InvalidArgumentError
from tiercache.testing.sglang import MISSING, PoolShape, attach, host_pool, storage_config

pytest.importorskip("sglang.srt.mem_cache.storage.backend_factory", reason=MISSING)

from tiercache.connector.sglang import ChunkOrder, SglangStorageOptions, page_keys


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"adress": "unix:/tmp/x.sock"}, "extra_config.adress"),
        ({"timeout_s": 0}, "extra_config.timeout_s"),
        ({"timeout_s": "2"}, "extra_config.timeout_s"),
        ({"data_plane": "rdma"}, "extra_config.data_plane"),
        ({"token": ""}, "extra_config.token"),
        ({"cache_salt": 7}, "extra_config.cache_salt"),
        ({"address": ""}, "extra_config.address"),
    ],
)
def test_a_bad_extra_config_fails_sglangs_attach_naming_the_key(extra: dict[str, Any], field: str) -> None:
    pool = host_pool("page_first")
    with pytest.raises(InvalidArgumentError) as exc:
        attach(pool, storage_config({"address": "unix:/tmp/none.sock", **extra}, "page_first"))
    assert exc.value.field == field


def test_options_parse_every_key() -> None:
    options = SglangStorageOptions.from_extra_config(
        {
            "backend_name": "tiercache", "module_path": "tiercache.connector.sglang",
            "class_name": "TierCacheStorage", "interface_v1": 1, "address": "host:7000", "token": "t",
            "cache_salt": "s", "model": "m", "revision": "r", "timeout_s": 3, "data_plane": "stream",
        }
    )  # fmt: skip
    assert options == SglangStorageOptions("host:7000", "t", "s", "m", "r", 3.0, DataPlaneMode.STREAM)


def test_a_host_layout_it_does_not_move_is_refused_by_name() -> None:
    pool = host_pool("page_head")
    with pytest.raises(InvalidArgumentError) as exc:
        attach(pool, storage_config({"address": "unix:/tmp/none.sock"}, "page_head"))
    assert exc.value.field == "mem_pool_host.layout"
    assert "page_first" in str(exc.value)


def test_no_model_name_is_refused_unless_the_extra_config_gives_one() -> None:
    pool = host_pool("page_first")
    with pytest.raises(InvalidArgumentError) as exc:
        attach(pool, storage_config({"address": "unix:/tmp/none.sock"}, "page_first", model=""))
    assert exc.value.field == "extra_config.model"
    named = attach(
        pool, storage_config({"address": "unix:/tmp/none.sock", "model": "m"}, "page_first", model="")
    )
    assert named.identity.model_id == "m"
    named.close()


def _namespace(layout: str = "page_first", mla: bool = False, tp_rank: int = 0, tp_size: int = 1) -> Any:
    pool = host_pool(layout, PoolShape(), mla=mla)
    backend = attach(
        pool,
        storage_config({"address": "unix:/tmp/none.sock"}, layout, mla=mla, tp_rank=tp_rank, tp_size=tp_size),
    )
    backend.close()
    return backend.namespace


def test_namespaces_share_only_what_holds_the_same_bytes() -> None:
    # MLA: every TP rank holds the same latents
    assert _namespace(mla=True, tp_rank=0, tp_size=1) == _namespace(mla=True, tp_rank=1, tp_size=2)
    # MHA: each TP rank holds its own heads
    assert _namespace(tp_rank=0, tp_size=2) != _namespace(tp_rank=1, tp_size=2)
    # the same bytes in layer_first and page_first_direct pools; page_first orders them otherwise
    layer_first = _namespace("layer_first")
    assert layer_first == _namespace("page_first_direct")
    assert layer_first != _namespace("page_first")
    assert layer_first.revision.endswith(ChunkOrder.LAYER_MAJOR.value)
    assert layer_first.layout.chunk_bytes == _namespace("page_first").layout.chunk_bytes


def test_page_keys_are_stable_and_distinct() -> None:
    keys = page_keys(["a" * 64, "b" * 64, "a" * 64])
    assert keys[0] == keys[2] != keys[1] and all(len(k) == 32 for k in keys)
    with pytest.raises(InvalidArgumentError) as exc:
        page_keys(["a", 3])  # type: ignore[list-item]
    assert exc.value.field == "keys[1]"
