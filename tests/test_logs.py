"""The per-image request line: written straight to the gateway's handler when nothing else
would see the record, through `logging` otherwise, and the same line either way."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator

import pytest

from gateway import logs

FIELDS = {
    "method": "Detect",
    "code": "OK",
    "request_id": "0123456789abcdef0123456789abcdef",
    "model": "detector",
    "version": None,
    "detections": 3,
    "latency_ms": {"decode": 0.02, "upstream": 1.5, "total": 1.75},
}


NAME = "gatewaytest.request"


@pytest.fixture
def gateway_logging() -> Iterator[io.StringIO]:
    """Logging as `logs.setup` leaves it in the gateway, on a logger tree of its own, writing
    into a buffer. pytest attaches its capture handlers to the root logger and to loggers
    that do not propagate when each test phase starts, so the handlers are set at first use
    (see `_ours`)."""
    parent = logging.getLogger("gatewaytest")
    buffer = io.StringIO()
    parent.propagate = False
    parent.setLevel(logging.INFO)
    _HANDLER[:] = [logs.JsonHandler(buffer)]
    try:
        yield buffer
    finally:
        parent.handlers[:] = []
        parent.propagate = True
        parent.setLevel(logging.NOTSET)


_HANDLER: list[logs.JsonHandler] = []


def _ours() -> logs.RequestLog:
    """The request log of the test tree, with the gateway's handler alone on it."""
    logging.getLogger("gatewaytest").handlers[:] = _HANDLER
    return logs.RequestLog(NAME)


def _lines(buffer: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in buffer.getvalue().splitlines()]


def test_direct_line_is_the_line_logging_writes(gateway_logging: io.StringIO) -> None:
    request_log = _ours()
    assert request_log._sole_handler() is logging.getLogger("gatewaytest").handlers[0]
    request_log.write(FIELDS)
    request_log.logger.info("request", extra={"fields": FIELDS})  # the same, through logging
    direct, through_logging = gateway_logging.getvalue().splitlines()
    # Byte for byte, but for the time of day (written a moment apart).
    time_field = re.compile(r'"time":"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"')
    assert time_field.search(direct) and time_field.search(through_logging)
    assert time_field.sub("T", direct) == time_field.sub("T", through_logging)
    line = json.loads(direct)
    assert list(line)[:5] == ["time", "level", "logger", "message", "pid"]
    assert line["level"] == "INFO" and line["logger"] == NAME
    assert line["message"] == "request" and line["latency_ms"] == FIELDS["latency_ms"]


def test_another_handler_gets_a_record_and_the_line_is_written_once(
    gateway_logging: io.StringIO,
) -> None:
    records: list[logging.LogRecord] = []
    listener = logging.Handler()
    listener.emit = records.append  # type: ignore[method-assign]
    logging.getLogger(NAME).addHandler(listener)
    try:
        request_log = _ours()
        assert request_log._sole_handler() is None
        request_log.write(FIELDS)
    finally:
        logging.getLogger(NAME).removeHandler(listener)
    assert [getattr(r, "fields", None) for r in records] == [FIELDS]
    assert [line["request_id"] for line in _lines(gateway_logging)] == [FIELDS["request_id"]]


def test_a_filter_on_the_way_is_honoured(gateway_logging: io.StringIO) -> None:
    request_log = _ours()
    drop_all = logging.Filter("nothing.matches")
    request_log.logger.addFilter(drop_all)
    try:
        assert request_log._sole_handler() is None
        request_log.write(FIELDS)
    finally:
        request_log.logger.removeFilter(drop_all)
    assert gateway_logging.getvalue() == ""


def test_level_above_info_turns_the_line_off(gateway_logging: io.StringIO) -> None:
    request_log = _ours()
    logging.getLogger("gatewaytest").setLevel(logging.WARNING)
    assert not request_log.enabled()
    logging.getLogger("gatewaytest").setLevel(logging.INFO)
    assert request_log.enabled()


def test_a_write_that_fails_is_reported_and_the_request_goes_on(
    gateway_logging: io.StringIO, capsys: pytest.CaptureFixture[str]
) -> None:
    gateway_logging.close()  # writing to it raises ValueError
    _ours().write(FIELDS)
    assert "--- Logging error ---" in capsys.readouterr().err


def test_a_value_orjson_refuses_still_gets_its_line(gateway_logging: io.StringIO) -> None:
    _ours().write({**FIELDS, "huge": 2**70})
    (line,) = _lines(gateway_logging)
    assert line["huge"] == 2**70


def test_setup_leaves_the_gateway_handler_alone_on_the_request_line() -> None:
    """As the gateway runs (no pytest handlers): the request line takes the direct way."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        logs.setup("INFO")
        root.handlers[:] = [h for h in root.handlers if isinstance(h, logs.JsonHandler)]
        assert logs.RequestLog()._sole_handler() is root.handlers[0]
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
