"""Entry point: `python -m serving.local` with tensorflow_model_server's flags.

Flag errors exit with code 2; startup failures print TF Serving's
`Failed to start server. Error: ...` line and exit with 255 (its -1). Both happen before
TensorFlow is imported where the flags and config files alone show the problem.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from importlib import metadata

from serving.local.config import read_startup_config
from serving.local.errors import ServingError, report_startup_failure
from serving.local.flags import FlagError, HelpRequested, Options, parse_flags, usage
from serving.local.signals import block_stop_signals

_EXIT_USAGE = 2


def main(argv: Sequence[str] | None = None) -> int:
    """Parses the flags and runs the server; returns the exit code."""
    try:
        options = parse_flags(sys.argv[1:] if argv is None else argv)
    except HelpRequested:
        print(usage())
        return 0
    except FlagError as exc:
        print(f"serving.local: error: {exc}", file=sys.stderr)
        return _EXIT_USAGE
    if options.version:
        print(_version_text())
        return 0
    return _run(options)


def _run(options: Options) -> int:
    block_stop_signals()  # before TensorFlow or gRPC start any thread; see signals.py
    _configure_environment()
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s.%(msecs)03d %(levelname).1s %(name)s] %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
    )
    try:
        startup = read_startup_config(options)
    except ServingError as exc:
        return report_startup_failure(exc)
    from serving.local.server import serve  # imports TensorFlow: only once startup is sane

    return serve(options, startup)


def _configure_environment() -> None:
    """TensorFlow settings that must be in place before it is imported.

    oneDNN off: TF Serving's standard build uses TensorFlow's Eigen kernels, which answer
    a malformed input shape with INVALID_ARGUMENT, while some oneDNN kernels CHECK-fail and
    kill the process. C++ INFO and WARNING logs off: INFO is start-up noise, and a kernel
    that fails on a request logs a WARNING quoting the request's input verbatim (an image's
    bytes, for a tf_example model sent a bare image); the client gets that status anyway.
    Both can be overridden from the environment.
    """
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _version_text() -> str:
    return (
        f"TensorFlow ModelServer: {_installed('tensorflow-serving-api')} "
        "(serving.local, a local stand-in)\n"
        f"TensorFlow Library: {_installed('tensorflow')}"
    )


def _installed(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


if __name__ == "__main__":
    sys.exit(main())
