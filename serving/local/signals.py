"""SIGTERM/SIGINT without Python signal handlers: blocked everywhere, awaited by one thread.

A Python-level handler runs inside whatever the main thread was doing; a second signal
arriving while the first handler holds a lock (Event.set) deadlocks the process. Blocking
the signals before any other thread exists (every thread, TensorFlow's and gRPC's included,
inherits the mask) and taking them with sigwait in a watcher thread avoids that.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


def block_stop_signals() -> None:
    """Blocks SIGTERM/SIGINT in the calling thread and in every thread it starts later."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


def watch_stop_signals(on_stop: Callable[[], None]) -> threading.Thread:
    """Calls `on_stop` (from a watcher thread) for every SIGTERM/SIGINT received."""

    def watch() -> None:
        while True:
            signum = signal.sigwait(STOP_SIGNALS)
            log.info("Received signal %d, shutting down", signum)
            on_stop()

    thread = threading.Thread(target=watch, name="signals", daemon=True)
    thread.start()
    return thread
