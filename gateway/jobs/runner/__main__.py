"""`detection-batch` / `python -m gateway.jobs.runner`: the command line of the batch runner.

detection-batch INPUT OUTPUT --target HOST:PORT [options]
detection-batch INPUT OUTPUT --target HOST:PORT --pipeline NAME [options]
detection-batch finalize OUTPUT
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from gateway import errors
from gateway.api import pipelines
from gateway.api.arguments import (
    add_generic_option,
    add_option_arguments,
    add_task_arguments,
    add_tls_arguments,
    check_pipeline_flags,
    option_flag,
    parse_options,
    tls_from_args,
)
from gateway.api.bindings import Binding, Bindings
from gateway.domain import ModelRef
from gateway.errors import GatewayError
from gateway.jobs.runner import job, sources, storage
from gateway.jobs.runner.access import Guard
from gateway.jobs.runner.dataset_limits import LimitExceeded, Limits
from gateway.jobs.runner.output import Output
from gateway.jobs.runner.shard import RunSettings
from gateway.jobs.runner.transport import Deliver, StopJob
from gateway.jobs.spec import FORMATS, JobSpec
from gateway.jobs.transports.over_grpc import GrpcTransport, Knobs, check_options
from gateway.tasks.builtin import BUILT_IN

SHARD_INDEX_ENV = "JOB_COMPLETION_INDEX"  # set by Kubernetes in Indexed Jobs
SHARD_COUNT_ENV = "BATCH_SHARD_COUNT"  # set it to the Job's completions
# The dataset limits (gateway.jobs.runner.dataset_limits.Limits), each a flag of its name.
_LIMIT_FLAGS = (
    ("max_image_bytes", "largest image read (a larger file is that line's error, never read); "
     "also bounds a manifest line and a TFRecord record (the gateway's GATEWAY_MAX_IMAGE_BYTES)"),
    ("max_items", "manifest lines and TFRecord records this run reads before it stops (exit 2)"),
    ("max_input_files", "files INPUT may list (exit 2 past it)"),
    ("max_decompressed_bytes",
     "bytes one manifest or TFRecord file may hold uncompressed (exit 2 past it)"),
)  # fmt: skip


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    try:
        return int(value) if value.strip() else default
    except ValueError:
        raise SystemExit(f"detection-batch: error: {name}={value!r} is not a number") from None


def run_parser(bindings: Bindings = BUILT_IN) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="detection-batch",
        description="Run every image of a dataset through the gateway and write JSON Lines "
        "results; resumable after any crash (run the same command again). "
        "`detection-batch finalize OUTPUT` writes the job summary once every shard is done.",
    )
    parser.add_argument(
        "input",
        metavar="INPUT",
        help="directory, prefix, glob, manifest or "
        "TFRecord file; local path or fsspec URL (s3://, gs://, file://...)",
    )
    parser.add_argument("output", metavar="OUTPUT", help="output prefix (local or fsspec URL)")
    parser.add_argument("--target", required=True, help="gateway host:port")
    add_task_arguments(parser, bindings)
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="auto",
        help="dataset format (auto: from the file names)",
    )
    parser.add_argument("--model", default="", help="model name (default: the gateway's)")
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument("--version", type=int, help="model version")
    choice.add_argument("--label", help="model version label, e.g. stable")
    add_option_arguments(parser, [*bindings, pipelines.binding(bindings)])
    add_generic_option(parser)
    parser.add_argument("--concurrency", type=int, default=64, help="images in flight")
    parser.add_argument(
        "--stream-window",
        type=int,
        default=4,
        help="images in flight per stream; at least the gateway's GATEWAY_STREAM_WINDOW (a "
        "gateway that answers once its window is full would otherwise wait for --timeout)",
    )
    parser.add_argument(
        "--connections", type=int, default=2, help="HTTP/2 connections to the gateway"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds an image may wait for its answer before it is resent",
    )
    parser.add_argument(
        "--give-up-after",
        type=float,
        default=120.0,
        help="seconds without any answer while calls fail before the run stops (exit 1, resumable)",
    )
    parser.add_argument(
        "--shard-index",
        type=int,
        default=None,
        help=f"this shard, 0-based [${SHARD_INDEX_ENV}; default 0]",
    )
    parser.add_argument(
        "--shard-count",
        type=int,
        default=None,
        help=f"number of shards [${SHARD_COUNT_ENV}; default 1]",
    )
    parser.add_argument(
        "--checkpoint-seconds",
        type=float,
        default=2.0,
        help="commit answered lines this often (a restart redoes at most this)",
    )
    parser.add_argument(
        "--log-interval",
        type=float,
        default=5.0,
        help="seconds between JSON progress lines (without a terminal)",
    )
    defaults = Limits()
    for name, text in _LIMIT_FLAGS:
        flag = option_flag(name)
        parser.add_argument(flag, type=int, default=getattr(defaults, name), help=text)
    parser.add_argument(
        "--allowed-input-uris",
        default=None,
        help="comma-separated prefixes the job may read, manifest lines included (default: "
        "anything this process can read; the gateway's kubernetes executor sets it)",
    )
    parser.add_argument(
        "--fenced-uris",
        default="",
        help="comma-separated places no input may lie in or hold (the gateway's job store), "
        "except below an allowed prefix inside them (the job's own upload)",
    )
    parser.add_argument(
        "--owner",
        default="",
        help="run the images as this caller (its typed identity: its quota and payload log); "
        "the gateway takes it only from the identities GATEWAY_BATCH_RUNNER_IDENTITIES names "
        "(the kubernetes executor sets it for its runner pods)",
    )
    add_tls_arguments(parser)
    return parser  # fmt: skip


def _run(argv: Sequence[str], bindings: Bindings) -> int:
    parser = run_parser(bindings)
    a = parser.parse_args(argv)
    shard_index = a.shard_index if a.shard_index is not None else _env_int(SHARD_INDEX_ENV, 0)
    shard_count = a.shard_count if a.shard_count is not None else _env_int(SHARD_COUNT_ENV, 1)
    if shard_count < 1 or not 0 <= shard_index < shard_count:
        parser.error(f"shard index {shard_index} must be in [0, shard count {shard_count})")
    if a.concurrency < 1 or a.stream_window < 1 or a.connections < 1:
        parser.error("--concurrency, --stream-window and --connections must be at least 1")
    if bool(a.cert_file) != bool(a.key_file):
        parser.error("--cert-file and --key-file go together")
    check_pipeline_flags(parser, a, bindings)
    model = ModelRef(a.pipeline) if a.pipeline else ModelRef(a.model, a.version, a.label)
    verb = a.task or bindings.verbs[0]
    binding = pipelines.binding(bindings) if a.pipeline else bindings.for_verb(verb)
    try:
        options = _options(parser, a, binding)
        spec = JobSpec(
            input=a.input, output=a.output, format=a.format, task=binding.task, model=model,
            options=options, shards=shard_count,
        )  # fmt: skip
        spec.check()
    except GatewayError as e:
        parser.error(e.message)
    knobs = Knobs(
        target=a.target, concurrency=a.concurrency, stream_window=a.stream_window,
        connections=a.connections, timeout=a.timeout, give_up_after=a.give_up_after,
        tls=tls_from_args(a), owner=a.owner,
    )  # fmt: skip
    sizes = {name: getattr(a, name) for name, _ in _LIMIT_FLAGS}
    if min(sizes.values()) < 1:
        parser.error("--max-image-bytes, --max-items, --max-input-files and "
                     "--max-decompressed-bytes must be at least 1")  # fmt: skip
    limits = Limits(**sizes, items_setting="--max-items")
    settings = RunSettings(
        shard_index=shard_index, checkpoint_seconds=a.checkpoint_seconds,
        log_interval=a.log_interval, limits=limits,
    )  # fmt: skip

    check_options(spec, binding, knobs)

    def connect(deliver: Deliver) -> GrpcTransport:
        return GrpcTransport(spec, binding, knobs, deliver)

    guard = None
    if a.allowed_input_uris is not None:
        fences = [p.strip() for p in a.fenced_uris.split(",") if p.strip()]
        guard = Guard.of(
            (p.strip() for p in a.allowed_input_uris.split(",") if p.strip()), fences=fences
        )
    summary = asyncio.run(job.run_shard(spec, connect, knobs.concurrency, settings, guard))
    print(json.dumps(summary), flush=True)
    return 0


def _options(
    parser: argparse.ArgumentParser, a: argparse.Namespace, binding: Binding
) -> dict[str, Any]:
    """Every option of the task: its own flag's value, or --option's (not both)."""
    options = {name: getattr(a, name) for name in binding.options}
    generic = parse_options(binding, a.generic_options)
    for name, value in generic.items():
        if options[name] != parser.get_default(name):
            flag = option_flag(name)
            raise errors.invalid_input(f"{flag} and --option {name}=... both set {name}: give one")
        options[name] = value
    return options


def _finalize(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="detection-batch finalize",
        description="Write OUTPUT/summary.json and OUTPUT/_SUCCESS once every shard is done.",
    )
    parser.add_argument("output", metavar="OUTPUT")
    a = parser.parse_args(argv)
    summary = job.finalize(Output(storage.resolve(a.output)))
    print(json.dumps(summary), flush=True)
    return 0


def main(argv: Sequence[str] | None = None, bindings: Bindings = BUILT_IN) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "finalize":
            return _finalize(argv[1:])
        return _run(argv, bindings)
    except (
        job.JobError,
        sources.DatasetError,
        storage.StorageError,
        GatewayError,
        LimitExceeded,
    ) as e:
        print(f"detection-batch: error: {e}", file=sys.stderr)
        return 2
    except (StopJob, sources.ReadError) as e:
        print(f"detection-batch: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("detection-batch: interrupted; run the same command again to resume",
              file=sys.stderr)  # fmt: skip
        return 130


if __name__ == "__main__":
    sys.exit(main())
