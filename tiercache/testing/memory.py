"""What of a mapping this process has mapped in: the test side of ``SlotMapping.prefault``.

Primitives:
    resident_bytes: the Rss of the mapping of this process that holds an address.
"""

from __future__ import annotations

from pathlib import Path


def resident_bytes(address: int) -> int:
    """The Rss of the mapping of this process that holds ``address`` (Linux: ``/proc/self/smaps``): the bytes
    of it whose pages are in this process's page tables.

    Raises:
        LookupError: no mapping of this process holds ``address``.
    """
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(x, 16) for x in head.split("-"))
            inside = start <= address < end
        elif inside and head == "Rss:":
            return int(line.split()[1]) * 1024
    raise LookupError(f"no mapping of this process holds {address:#x}")
