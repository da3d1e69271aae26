"""glibc malloc settings: memory that stays bounded under many differently sized images, and
no page-fault churn on the megabyte buffers every pixel-mode request allocates (Linux with
glibc only; elsewhere nothing happens).

Measured over 20,000 hostile images (tests/reliability/test_hostile_input.py) and pixel-mode
requests at concurrency 1 (bench/results.md, "Allocator" note):
- arenas: glibc gives each thread that contends for the heap its own arena (up to 8 per
  core), and memory freed in one arena is not reused by the others; the decode threads each
  grew one, and RSS climbed from 60 to about 155 MiB. M_ARENA_MAX=2 keeps them few.
- the mmap and trim thresholds: by default glibc serves blocks above 128 KiB with mmap and
  raises that threshold as large blocks are freed; a low fixed threshold (256 KiB) keeps RSS
  near 80 MiB but makes every request map, fault in and unmap its buffers (a 640x480 pixel
  request's 0.9 MB ones: a large part of its time in the gateway). A
  fixed 32 MiB M_MMAP_THRESHOLD keeps request-sized buffers on the heap (12 MP decode
  buffers are still mapped and returned), and M_TRIM_THRESHOLD=64 MiB keeps up to 64 MiB of
  freed heap for the next requests instead of returning it at once; over 20,000 hostile
  images RSS went from 80 to at most 133 MiB (`make soak`; the test allows the trim
  threshold plus 16 MiB of growth).
Each setting is skipped when its environment variable (MALLOC_ARENA_MAX,
MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_) is set: glibc has applied the operator's value.
"""

from __future__ import annotations

import ctypes
import os
import sys

# mallopt parameter numbers (glibc malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
ARENA_MAX = 2
MMAP_THRESHOLD = 32 * 1024 * 1024
TRIM_THRESHOLD = 64 * 1024 * 1024
SETTINGS = (
    ("MALLOC_ARENA_MAX", M_ARENA_MAX, ARENA_MAX),
    ("MALLOC_MMAP_THRESHOLD_", M_MMAP_THRESHOLD, MMAP_THRESHOLD),
    ("MALLOC_TRIM_THRESHOLD_", M_TRIM_THRESHOLD, TRIM_THRESHOLD),
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
