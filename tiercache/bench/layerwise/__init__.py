"""``tiercache-bench layerwise``: layerwise loading overlapped with per-layer compute, as a timeline.

Modules: command (flags), run (the measurement), report (the table).
"""
