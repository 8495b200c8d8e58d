"""``tiercache-bench sglang``: SGLang HiCache's zero-copy storage calls through ``TierCacheStorage`` vs memcpy."""
