"""glibc malloc settings that keep the gateway's memory flat under many differently sized
images (Linux with glibc only; elsewhere nothing happens).

Measured over 20,000 hostile images (bench/soak-report.json): with glibc's defaults RSS
climbed from 60 to about 155 MiB and stayed there. Two causes, two settings:
- arenas: glibc gives each thread that contends for the heap its own arena (up to 8 per
  core), and memory freed in one arena is not reused by the others; the decode threads
  each grew one. M_ARENA_MAX=2 keeps them few.
- the mmap threshold: glibc serves allocations above 128 KiB with mmap (returned to the OS
  on free), but raises that threshold to the size of each large block freed, up to 32 MiB,
  after which decode buffers and 1-2 MB metadata blocks come from the heap and fragment it.
  A fixed M_MMAP_THRESHOLD of 256 KiB keeps large buffers out of the heap.
Together RSS stays near 80 MiB. Each setting is skipped when its environment variable
(MALLOC_ARENA_MAX, MALLOC_MMAP_THRESHOLD_) is set: glibc has applied the operator's value.
"""

from __future__ import annotations

import ctypes
import os
import sys

# mallopt parameter numbers (glibc malloc.h).
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
ARENA_MAX = 2
MMAP_THRESHOLD = 256 * 1024
SETTINGS = (
    ("MALLOC_ARENA_MAX", M_ARENA_MAX, ARENA_MAX),
    ("MALLOC_MMAP_THRESHOLD_", M_MMAP_THRESHOLD, MMAP_THRESHOLD),
)


def tune_malloc() -> dict[str, int]:
    """Applies the settings not given in the environment; returns those applied."""
    if not sys.platform.startswith("linux"):
        return {}
    try:
        # The process's own symbols: libc is loaded already (ctypes.util.find_library would
        # run a subprocess, and the gateway opens no files it does not need).
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl has no mallopt)
        return {}
    applied = {}
    for variable, parameter, value in SETTINGS:
        if variable in os.environ:
            continue
        if mallopt(parameter, value) == 1:
            applied[variable] = value
    return applied
