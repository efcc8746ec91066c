"""The default bytes one SOURCE may take to read (``--max-read-bytes``): what fits the machine.

A budget larger than the machine's memory bounds nothing a reader could hold, so the default is half the
physical memory (16 GiB at most, 1 GiB at least): 12 GiB on a 24 GB machine, 3.5 GiB on a 7 GB CI runner.
A module of its own, with no imports beyond the standard library, because the command line writes the
default into its options without loading any reader."""

from __future__ import annotations

import os

GIB = 1 << 30


def default_max_read_bytes() -> int:
    """Half the physical memory, within [1 GiB, 16 GiB]; 16 GiB where the machine does not say."""
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return 16 * GIB
    return int(min(16 * GIB, max(GIB, memory // 2)))


DEFAULT_MAX_READ_BYTES = default_max_read_bytes()
