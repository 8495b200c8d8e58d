"""tiercache as SGLang HiCache's storage backend: ``TierCacheStorage`` (a ``HiCacheStorage``).

Loaded by SGLang's dynamic storage factory::

    python -m sglang.launch_server --model-path MODEL --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "tiercache",
            "module_path": "tiercache.connector.sglang", "class_name": "TierCacheStorage",
            "interface_v1": 1, "address": "unix:/run/user/1000/tiercache/daemon.sock"}'

Modules (one responsibility each):
    config: ``SglangStorageOptions``, parsed from the extra config.
    pages: the host pool's pages as chunks (layouts, block planes, page numbering).
    namespace: the namespace of a server's pages and the mapping of SGLang's page hashes to keys.
    storage: ``TierCacheStorage`` — SGLang's calls turned into the connector's transfers.

Importing this package imports SGLang (``pip install 'tiercache[sglang]'``; README: SGLang).
"""

from .config import SglangStorageOptions
from .namespace import StorageIdentity, page_keys, storage_identity
from .pages import ChunkOrder, HostPages, host_pages
from .storage import TierCacheStorage

__all__ = [
    "ChunkOrder",
    "HostPages",
    "SglangStorageOptions",
    "StorageIdentity",
    "TierCacheStorage",
    "host_pages",
    "page_keys",
    "storage_identity",
]
