"""``tiercache-bench faults``: kill -9 mid-stores, corrupted L3 values, killed engines, garbage RPCs, as figures.

The machinery is :mod:`tiercache.testing.faults` (shared with ``tests/faults``); :mod:`.command` runs it and
reports each figure next to what it must be.
"""
