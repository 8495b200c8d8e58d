"""The three storage tiers behind one small batch-first protocol (see :mod:`tiercache.tiers.base`)."""
