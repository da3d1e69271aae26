"""TF Serving status errors: one exception type carrying a gRPC code and TF Serving's text.

Every failure in the local server is raised as `ServingError` and turned into a gRPC status
in one place (`servicers.py`), the way TF Serving's `ToGRPCStatus` does.
"""

from __future__ import annotations

import grpc

# TF Serving cuts longer messages (model_servers/grpc_status_util.cc).
MAX_MESSAGE_CHARS = 1024
TRUNCATED_SUFFIX = "...TRUNCATED"

# How tensorflow_model_server reports a failed start (main.cc); it then returns -1.
STARTUP_FAILED = "Failed to start server. Error:"
EXIT_STARTUP_FAILED = 255

# absl::StatusCode names as printed by absl::Status::ToString(), by gRPC code.
_CODE_NAMES = {code: code.name for code in grpc.StatusCode}


class ServingError(Exception):
    """A non-OK TF Serving status."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        """Formats like absl::Status::ToString(), e.g. `NOT_FOUND: ...`."""
        return f"{_CODE_NAMES[self.code]}: {self.message}"


def invalid_argument(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.INVALID_ARGUMENT, message)


def not_found(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.NOT_FOUND, message)


def failed_precondition(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.FAILED_PRECONDITION, message)


def truncate(message: str) -> str:
    """Applies TF Serving's 1024-character limit to a status message."""
    if len(message) > MAX_MESSAGE_CHARS:
        return message[:MAX_MESSAGE_CHARS] + TRUNCATED_SUFFIX
    return message


def code_from_number(number: int) -> grpc.StatusCode:
    """The gRPC code for a TF/absl status code number (they are the same numbers)."""
    for code in grpc.StatusCode:
        if code.value[0] == number:
            return code
    return grpc.StatusCode.UNKNOWN


def from_exception(exc: BaseException) -> ServingError:
    """Converts an exception from TensorFlow or the OS into the status TF Serving would give.

    TensorFlow's `OpError` carries the C++ status code and message; file-system errors from
    the Python SavedModel loader become NOT_FOUND like TF's C++ file system would report.
    """
    if isinstance(exc, ServingError):
        return exc
    error_code = getattr(exc, "error_code", None)
    message = getattr(exc, "message", None)
    if isinstance(error_code, int) and isinstance(message, str):
        return ServingError(code_from_number(error_code), message)
    if isinstance(exc, OSError):
        return not_found(str(exc))
    return ServingError(grpc.StatusCode.UNKNOWN, f"{type(exc).__name__}: {exc}")


def report_startup_failure(error: ServingError) -> int:
    """Prints TF Serving's startup failure line; returns the exit code to use."""
    print(f"{STARTUP_FAILED} {error}", flush=True)
    return EXIT_STARTUP_FAILED
