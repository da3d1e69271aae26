"""Structured logging: one JSON object per line, for log pipelines and `jq`."""

from __future__ import annotations

import json
import logging
import os
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
        exception = self.formatException(record.exc_info) if record.exc_info else None
        return self.line(
            record.created,
            record.msecs,
            record.levelname,
            record.name,
            record.getMessage(),
            record.process,
            getattr(record, "fields", None),
            exception,
        )

    def line(
        self,
        created: float,
        msecs: float,
        level: str,
        logger: str,
        message: str,
        pid: int | None,
        fields: dict[str, Any] | None,
        exception: str | None = None,
    ) -> str:
        entry: dict[str, Any] = {
            "time": f"{self._time(created)}.{int(msecs):03d}Z",
            "level": level,
            "logger": logger,
            "message": message,
            # Which process wrote it: with --workers, which worker served the request.
            "pid": pid,
        }
        if fields:
            entry.update(fields)
        if exception:
            entry["exception"] = exception
        return _encode(entry)


# The process id in every line, read once (and again in a forked child): os.getpid() is a
# system call, and the request line is written for every image.
_pid = os.getpid()


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


class JsonHandler(logging.StreamHandler):
    """The gateway's handler: JSON lines (JsonFormatter) on a stream."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.setFormatter(JsonFormatter())


class RequestLog:
    """The per-image line ("gateway.request", INFO, message "request", the fields given),
    the same from every door.

    Written through `logging` like any other line, except when the gateway's own handler
    is the only thing that would see the record (no other handler, no filter, on the
    logger or the ones above it: how `setup` leaves it). Then the line goes straight to
    that handler's stream, formatted by the same JsonFormatter: the same bytes, under the
    handler's lock, before the answer is sent, without building a LogRecord and passing it
    through the logger hierarchy, a measurable part of an image's CPU under load
    (bench/results.md); a LogRecord is still made whenever anyone else listens (a second
    handler, pytest's caplog, a filter).
    """

    def __init__(self, name: str = "gateway.request") -> None:
        self.logger = logging.getLogger(name)

    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)

    def _sole_handler(self) -> JsonHandler | None:
        """The gateway's handler when it alone would get an INFO record of this logger."""
        logger: logging.Logger | None = self.logger
        if self.logger.disabled:
            return None
        found: JsonHandler | None = None
        while logger is not None:
            if logger.filters:
                return None
            for handler in logger.handlers:
                if found is not None or type(handler) is not JsonHandler:
                    return None
                found = handler
            if not logger.propagate:
                break
            logger = logger.parent
        if (
            found is None
            or found.level > logging.INFO
            or found.filters
            or type(found.formatter) is not JsonFormatter
        ):
            return None
        return found

    def write(self, fields: dict[str, Any]) -> None:
        """Logs the line at INFO (the caller checks `enabled()` first)."""
        handler = self._sole_handler()
        if handler is None:
            self.logger.info("request", extra={"fields": fields})
            return
        formatter = handler.formatter
        assert isinstance(formatter, JsonFormatter)
        created = time.time()
        try:
            with handler.lock:  # type: ignore[union-attr]
                line = formatter.line(
                    created,
                    (created - int(created)) * 1000,
                    "INFO",
                    self.logger.name,
                    "request",
                    _pid if logging.logProcesses else None,
                    fields,
                )
                handler.stream.write(line + handler.terminator)
                handler.stream.flush()
        except RecursionError:
            raise
        except Exception:
            # As StreamHandler.emit does: the error reported (once), the request goes on.
            record = self.logger.makeRecord(
                self.logger.name,
                logging.INFO,
                "(unknown file)",
                0,
                "request",
                (),
                None,
                extra={"fields": fields},
            )
            handler.handleError(record)


def setup(level: str) -> None:
    # The lines carry no source file, thread or process name: skip collecting them for
    # every record (the logging HOWTO's "Optimization"; the request line is per image).
    logging._srcfile = None
    logging.logThreads = False
    logging.logMultiprocessing = False
    handler = JsonHandler(sys.stderr)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


# Distinct (model, version) pairs whose bad outputs have been logged; bounded because model
# names come from clients (unknown ones fail earlier, but stay safe).
_MAX_REPORTED = 1024
_tasks_log = logging.getLogger("gateway.tasks")


class BadOutputLog:
    """Logs a model version's unusable outputs once, not once per request."""

    def __init__(self) -> None:
        self._reported: set[tuple[str, int]] = set()

    def report(self, model: str, version: int, problem: str) -> bool:
        """Logs a warning the first time `model` `version` gives bad outputs; True if logged."""
        key = (model, version)
        if key in self._reported or len(self._reported) >= _MAX_REPORTED:
            return False
        self._reported.add(key)
        _tasks_log.warning(
            "model outputs are unusable; requests to this version fail with "
            "FAILED_PRECONDITION (logged once per model version)",
            extra={"fields": {"model": model, "version": version, "problem": problem}},
        )
        return True


BAD_OUTPUTS = BadOutputLog()
