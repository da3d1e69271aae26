"""`detection-batch` / `python -m gateway.batch`: the command line of the batch runner.

detection-batch INPUT OUTPUT --target HOST:PORT [options]
detection-batch finalize OUTPUT
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence

from gateway.batch import job, runner, sources, storage
from gateway.batch.output import Output

SHARD_INDEX_ENV = "JOB_COMPLETION_INDEX"  # set by Kubernetes in Indexed Jobs
SHARD_COUNT_ENV = "BATCH_SHARD_COUNT"  # set it to the Job's completions


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    try:
        return int(value) if value.strip() else default
    except ValueError:
        raise SystemExit(f"detection-batch: error: {name}={value!r} is not a number") from None


def run_parser() -> argparse.ArgumentParser:
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
    parser.add_argument("--task", choices=(runner.DETECT, runner.CLASSIFY), default=runner.DETECT)
    parser.add_argument(
        "--format",
        choices=("auto", *sources.FORMATS),
        default="auto",
        help="dataset format (auto: from the file names)",
    )
    parser.add_argument("--model", default="", help="model name (default: the gateway's)")
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument("--version", type=int, help="model version")
    choice.add_argument("--label", help="model version label, e.g. stable")
    parser.add_argument(
        "--min-score", type=float, default=0.0, help="minimum score, 0 = the gateway's default"
    )
    parser.add_argument(
        "--max-detections",
        type=int,
        default=0,
        help="detections per image (detect), 0 = the gateway's default",
    )
    parser.add_argument(
        "--top-k", type=int, default=0, help="classes per image (classify), 0 = the model's default"
    )
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
    tls = parser.add_argument_group("TLS to the gateway")
    tls.add_argument("--tls", action="store_true", help="use TLS (implied by the files below)")
    tls.add_argument("--ca-file", default="", help="PEM CA bundle (default: system roots)")
    tls.add_argument("--cert-file", default="", help="PEM client certificate chain (mTLS)")
    tls.add_argument("--key-file", default="", help="PEM private key of --cert-file")
    tls.add_argument("--server-name", default="", help="name expected in the certificate")
    return parser  # fmt: skip


def _run(argv: Sequence[str]) -> int:
    parser = run_parser()
    a = parser.parse_args(argv)
    shard_index = a.shard_index if a.shard_index is not None else _env_int(SHARD_INDEX_ENV, 0)
    shard_count = a.shard_count if a.shard_count is not None else _env_int(SHARD_COUNT_ENV, 1)
    if shard_count < 1 or not 0 <= shard_index < shard_count:
        parser.error(f"shard index {shard_index} must be in [0, shard count {shard_count})")
    if not 0.0 <= a.min_score <= 1.0:
        parser.error(f"--min-score must be in [0, 1], got {a.min_score}")
    if a.max_detections < 0 or a.top_k < 0 or (a.version is not None and a.version < 1):
        parser.error("--max-detections and --top-k must be >= 0, --version >= 1")
    if a.concurrency < 1 or a.stream_window < 1 or a.connections < 1:
        parser.error("--concurrency, --stream-window and --connections must be at least 1")
    if bool(a.cert_file) != bool(a.key_file):
        parser.error("--cert-file and --key-file go together")
    args = job.JobArgs(
        input=a.input, output=a.output, format=a.format, task=a.task, model=a.model,
        version=a.version, label=a.label, min_score=a.min_score,
        max_detections=a.max_detections, top_k=a.top_k, shard_count=shard_count,
    )  # fmt: skip
    options = runner.Options(
        target=a.target, task=a.task, model=a.model, version=a.version, label=a.label,
        min_score=a.min_score, max_detections=a.max_detections, top_k=a.top_k,
        concurrency=a.concurrency, stream_window=a.stream_window, connections=a.connections,
        timeout=a.timeout, give_up_after=a.give_up_after,
        tls=runner.Tls(a.tls, a.ca_file, a.cert_file, a.key_file, a.server_name),
    )  # fmt: skip
    settings = job.RunSettings(
        shard_index=shard_index, checkpoint_seconds=a.checkpoint_seconds,
        log_interval=a.log_interval,
    )  # fmt: skip
    summary = asyncio.run(job.run_shard(args, options, settings))
    print(json.dumps(summary), flush=True)
    return 0


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


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "finalize":
            return _finalize(argv[1:])
        return _run(argv)
    except (job.JobError, sources.DatasetError, storage.StorageError) as e:
        print(f"detection-batch: error: {e}", file=sys.stderr)
        return 2
    except (runner.FatalError, sources.ReadError) as e:
        print(f"detection-batch: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("detection-batch: interrupted; run the same command again to resume",
              file=sys.stderr)  # fmt: skip
        return 130


if __name__ == "__main__":
    sys.exit(main())
