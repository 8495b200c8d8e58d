"""``tiercache-bench soak``: many engine processes against one daemon; errors, wrong bytes, daemon drift.

The machinery is :mod:`tiercache.testing.soak` (shared with ``tests/faults``); :mod:`.command` runs it and
reports each figure next to what it must be.
"""
