"""Structured logging: one JSON object per line, for log pipelines and `jq`."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

import orjson

# Anything orjson refuses (an int beyond 64 bits, a type it does not know) still gets its
# line, through the json module with repr() for what it cannot encode.
_fallback = json.JSONEncoder(separators=(",", ":"), default=repr).encode


def _encode(entry: dict[str, Any]) -> str:
    """One compact JSON object (orjson: the request line is written for every image)."""
    try:
        return orjson.dumps(entry).decode()
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return _fallback(entry)


class JsonFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        # The date and time to the second, made once per second rather than per line.
        self._second = -1
        self._stamp = ""

    def _time(self, created: float) -> str:
        second = int(created)
        if second != self._second:
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = second
        return self._stamp

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": f"{self._time(record.created)}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            # Which process wrote it: with --workers, which worker served the request.
            "pid": record.process,
        }
        fields = getattr(record, "fields", None)
        if fields:
            entry.update(fields)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return _encode(entry)


def setup(level: str) -> None:
    # The lines carry no source file, thread or process name: skip collecting them for
    # every record (the logging HOWTO's "Optimization"; the request line is per image).
    logging._srcfile = None
    logging.logThreads = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
