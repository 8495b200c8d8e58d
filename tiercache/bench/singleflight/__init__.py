"""``tiercache-bench singleflight``: identical requests on a cold cache, with and without single flight.

Modules: command (flags), run (the measurement), report (the table).
"""
