"""The shared tier's ceiling in ``bench tiers`` times what the tier's puts do: SETs of new keys.

The tier's warm-up ends with a delete, so its timed puts make new keys; overwriting a key instead lets Redis
reuse the old value's memory, which made the raw SET ceiling faster than any put of a new chunk can be.
"""

from __future__ import annotations

import torch

from tiercache.bench.tiers.shared_ceiling import measure_redis
from tiercache.testing.redis import RedisDeployment


def test_the_ceiling_times_sets_of_new_keys_and_leaves_none(single: RedisDeployment) -> None:
    client = single.nodes[0].client()
    try:
        single.flush()
        client.config_resetstat()
        srcs = [torch.full((4096,), i, dtype=torch.uint8) for i in range(6)]
        results = measure_redis(single.url, srcs, batch=4, warmup_rounds=2)
        stats = client.info("commandstats")
        assert stats["cmdstat_set"]["calls"] == 3 * 6  # two warm-up rounds and the timed one
        assert stats["cmdstat_get"]["calls"] == 3 * 6
        assert stats["cmdstat_del"]["calls"] == 3 * 6  # every round deletes its keys: no SET overwrites
        assert client.dbsize() == 0
        assert [r.timing.gbps > 0 for r in results] == [True, True]
    finally:
        client.close()
