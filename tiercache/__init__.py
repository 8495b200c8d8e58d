"""tiercache: a tiered KV-cache store (GPU HBM, shared host memory, LMDB on SSD) for LLM inference.

The core library: chunk keys (:mod:`tiercache.keys`), chunk layouts (:mod:`tiercache.layout`), the three
tiers (:mod:`tiercache.tiers`), policies (:mod:`tiercache.policies`) and the cache manager
(:mod:`tiercache.cache`). The daemon, connector and benchmark live in ``tiercache.daemon``,
``tiercache.connector`` and ``tiercache.bench``.
"""

__version__ = "0.1.0"
