"""TF Serving status errors: one exception type carrying a gRPC code and TF Serving's text.

Every failure in the local server is raised as `ServingError` and turned into a gRPC status
in one place (`servicers.py`), the way TF Serving's `ToGRPCStatus` does.
"""

from __future__ import annotations

import grpc

# TF Serving cuts longer messages (model_servers/grpc_status_util.cc).
MAX_MESSAGE_CHARS = 1024
TRUNCATED_SUFFIX = "...TRUNCATED"

# A binary value a message quotes (an image's bytes in a serialized tf.train.Example) is cut to
# this many bytes, escaped: enough to recognise a JPEG or PNG header, never the image.
BINARY_PREFIX_BYTES = 16

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


def readable(message: str | bytes) -> str:
    """`message` with the binary value it quotes cut to a short, escaped prefix.

    Text up to the first byte that is not printable UTF-8 (newlines and tabs are text: TF
    appends its node context after them) is kept as it is; then at most BINARY_PREFIX_BYTES
    bytes, escaped like a Python bytes literal, and `...` when more followed.
    """
    data = message.encode("utf-8", "surrogateescape") if isinstance(message, str) else message
    try:
        data.decode("utf-8")
        cut = len(data)
    except UnicodeDecodeError as exc:
        cut = exc.start
    for i, byte in enumerate(data[:cut]):
        if (byte < 0x20 and byte not in (0x09, 0x0A)) or byte == 0x7F:
            cut = i
            break
    if cut == len(data):
        return data.decode("utf-8")
    tail = data[cut : cut + BINARY_PREFIX_BYTES]
    more = "..." if len(data) > cut + BINARY_PREFIX_BYTES else ""
    return data[:cut].decode("utf-8") + repr(tail)[2:-1] + more


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
        return ServingError(code_from_number(error_code), readable(message))
    if isinstance(exc, UnicodeDecodeError) and isinstance(exc.object, bytes):
        # TensorFlow's Python binding could not turn a failed run's status into an OpError:
        # its message was not UTF-8, because the op quoted the input it could not parse (e.g.
        # ParseExample given an image's bytes instead of a serialized tf.train.Example). The
        # binding keeps the message up to its first NUL byte and loses the code; a kernel
        # that cannot parse its input answers INVALID_ARGUMENT (serving/local/FACTS.md,
        # `unparsable_example`).
        return invalid_argument(readable(exc.object))
    if isinstance(exc, OSError):
        return not_found(str(exc))
    return ServingError(grpc.StatusCode.UNKNOWN, f"{type(exc).__name__}: {exc}")


def report_startup_failure(error: ServingError) -> int:
    """Prints TF Serving's startup failure line; returns the exit code to use."""
    print(f"{STARTUP_FAILED} {error}", flush=True)
    return EXIT_STARTUP_FAILED
