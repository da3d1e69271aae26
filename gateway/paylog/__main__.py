"""`python -m gateway.paylog replay LOG OUT [--images DIR]`: a payload log back into
detection-batch inputs (gateway.paylog.replay), one manifest per task, model version and
options, with the command that runs each; the records that cannot be replayed are listed
with the reason (exit status 1 when there were some, 2 when the log cannot be read)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gateway.api.bindings import Bindings
from gateway.jobs.runner.storage import StorageError
from gateway.paylog.replay import DEFAULT_MAX_LINE, ReplayError, replay
from gateway.tasks.builtin import BUILT_IN


def main(argv: Sequence[str] | None = None, bindings: Bindings = BUILT_IN) -> int:
    """`bindings`: the tasks the logging gateway served (default: the built-in ones)."""
    parser = argparse.ArgumentParser(
        prog="python -m gateway.paylog",
        description="Turn a payload log back into detection-batch inputs.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "replay",
        help="write one detection-batch manifest per task, model version and options",
    )
    run.add_argument("log", metavar="LOG", help="log file, directory, prefix or glob (fsspec)")
    run.add_argument("out", metavar="OUT", help="directory or prefix to write (fsspec)")
    run.add_argument(
        "--images",
        metavar="DIR",
        help="images named by their SHA-256 (any extension), for records logged with only the hash",
    )
    run.add_argument(
        "--max-line-bytes",
        type=int,
        default=DEFAULT_MAX_LINE,
        help="longest log line read (longer ones are skipped unread)",
    )
    args = parser.parse_args(argv)
    try:
        summary = replay(args.log, args.out, bindings, args.images, args.max_line_bytes)
    except (ReplayError, StorageError, OSError) as e:
        print(f"gateway.paylog: error: {e}", file=sys.stderr)
        return 2
    for group in summary["groups"]:
        print(f"{group['records']} records: {group['command']}")
    for skipped in summary["skipped"]:
        print(f"cannot replay {skipped['line']}: {skipped['reason']}", file=sys.stderr)
    return 1 if summary["skipped"] else 0


if __name__ == "__main__":
    sys.exit(main())
