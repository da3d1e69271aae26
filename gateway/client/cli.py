"""`python -m gateway.client` / `detection-client`: run a task, or a pipeline, on images, one
JSON line each.

    python -m gateway.client IMAGE... --target localhost:50051 [--task classify] [--model NAME]
                             [--stream] [--tls --ca-file CA.pem ...] [--draw OUT.png]
    python -m gateway.client IMAGE... --http http://localhost:8080 [--task classify] ...
    python -m gateway.client IMAGE... --pipeline NAME [--min-score S] [--max-detections K] ...

Each line is the result (or the error) of one image; `--draw` also writes the image with its
result drawn on it, as its task draws it (boxes and labels, masks, keypoints, top classes); a
pipeline's as its first step's task draws it, with a caption per step under each instance's
label. The tasks and their option flags come from the bindings (gateway.api.bindings).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import grpc

from gateway.api.arguments import (
    add_option_arguments,
    add_task_arguments,
    add_tls_arguments,
    check_pipeline_flags,
    tls_from_args,
)
from gateway.api.bindings import Bindings
from gateway.api.pipelines import OPTIONS as PIPELINE_OPTIONS
from gateway.client.drawing import draw, draw_path, draw_pipeline
from gateway.client.http_client import HttpCallError, HttpClient
from gateway.client.messages import result_dict
from gateway.client.stubs import GatewayClient, TaskClient
from gateway.tasks.builtin import BUILT_IN

Call = Callable[..., Any]
Stream = Callable[..., Iterator[Any]]


def main(argv: Sequence[str] | None = None, bindings: Bindings = BUILT_IN) -> int:
    parser = _parser(bindings)
    args = parser.parse_args(argv)
    if args.http and args.stream:
        parser.error("--stream is gRPC only (the HTTP door takes one image per request)")
    verb = args.task or bindings.verbs[0]
    painter: Callable[[bytes, dict[str, Any], Path], None]
    if args.pipeline:
        check_pipeline_flags(parser, args, bindings)
        fields = {name: getattr(args, name, 0) for name in PIPELINE_OPTIONS}
        painter = partial(draw_pipeline, bindings=bindings)
    else:
        binding = bindings.for_verb(verb)
        if args.draw and binding.draw is None:
            parser.error(f"task {binding.verb} has no drawing; leave out --draw")
        fields = {"model": args.model, "version": args.version, "label": args.label}
        fields.update({name: getattr(args, name) for name in binding.options})
        painter = partial(draw, binding=binding)

    def report(index: int, path: Path, image: bytes, result: Any) -> bool:
        line = result_dict(result)
        print(json.dumps({"image": str(path), **line}))
        if args.draw and "error" not in line:
            try:
                painter(image, line, draw_path(args.draw, index, len(args.images)))
            except ValueError as exc:  # an answer of a task these bindings do not know
                print(f"cannot draw {path}: {exc}", file=sys.stderr)
                return True
        return "error" in line

    if args.http:
        http = HttpClient(args.http, timeout=args.timeout, task=verb, bindings=bindings)
        call = partial(http.run_pipeline, pipeline=args.pipeline) if args.pipeline else http.call
        return _main_http(args, call, fields, report)
    tls = tls_from_args(args)
    client: GatewayClient | TaskClient
    if args.pipeline:
        client = GatewayClient(args.target, bindings=bindings, timeout=args.timeout, tls=tls)
        call = partial(client.run_pipeline, pipeline=args.pipeline)
        stream: Stream = partial(client.run_pipeline_stream, pipeline=args.pipeline)
    else:
        client = TaskClient(args.target, binding, timeout=args.timeout, tls=tls)
        call, stream = client.call, client.stream
    with client:
        return _main_grpc(args, call, stream, fields, report)


def _parser(bindings: Bindings) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gateway.client",
        description=f"Run a task ({', '.join(bindings.verbs)}), or a pipeline of the gateway's "
        "model config, on images.",
    )
    parser.add_argument("images", nargs="+", type=Path, metavar="IMAGE")
    parser.add_argument("--target", default="localhost:50051", help="gateway host:port (gRPC)")
    parser.add_argument(
        "--http",
        metavar="URL",
        help="call the HTTP door at URL (e.g. http://localhost:8080) instead of gRPC",
    )
    add_task_arguments(parser, bindings)
    parser.add_argument("--model", default="", help="model name (default: the gateway's)")
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument("--version", type=int, help="model version")
    choice.add_argument("--label", help="model version label, e.g. stable")
    add_option_arguments(parser, bindings)
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per call")
    parser.add_argument("--stream", action="store_true", help="send all images on one stream")
    parser.add_argument(
        "--draw",
        type=Path,
        metavar="OUT.png",
        help="write the image with its result drawn (boxes and labels, masks, keypoints, top "
        "classes, ...; a pipeline's steps as captions under each instance's label); with "
        "several images OUT-0.png, OUT-1.png, ...",
    )
    add_tls_arguments(parser)
    return parser


def _main_grpc(
    args: argparse.Namespace,
    call: Call,
    stream: Stream,
    fields: dict[str, Any],
    report: Callable[[int, Path, bytes, Any], bool],
) -> int:
    failed = 0
    try:
        if args.stream:
            blobs = [path.read_bytes() for path in args.images]
            results: Iterable[Any] = stream(iter(blobs), **fields)
            for index, (path, image, result) in enumerate(
                zip(args.images, blobs, results, strict=True)
            ):
                failed += report(index, path, image, result)
        else:
            for index, path in enumerate(args.images):
                image = path.read_bytes()
                try:
                    result = call(image, **fields)
                except grpc.RpcError as exc:
                    failed += 1
                    error = {"code": exc.code().name, "message": exc.details()}
                    print(json.dumps({"image": str(path), "error": error}))
                    continue
                failed += report(index, path, image, result)
    except grpc.RpcError as exc:
        print(json.dumps({"error": {"code": exc.code().name, "message": exc.details()}}))
        return 1
    except OSError as exc:
        print(f"cannot read image: {exc}", file=sys.stderr)
        return 2
    return 1 if failed else 0


def _main_http(
    args: argparse.Namespace,
    call: Call,
    fields: dict[str, Any],
    report: Callable[[int, Path, bytes, Any], bool],
) -> int:
    failed = 0
    for index, path in enumerate(args.images):
        try:
            image = path.read_bytes()
        except OSError as exc:
            print(f"cannot read image: {exc}", file=sys.stderr)
            return 2
        try:
            result = call(image, **fields)
        except HttpCallError as exc:
            failed += 1
            error = {"code": exc.code, "message": exc.message, "http_status": exc.status}
            print(json.dumps({"image": str(path), "error": error}))
            continue
        except (OSError, ValueError) as exc:  # connection refused, bad URL
            print(
                json.dumps(
                    {"image": str(path), "error": {"code": "UNAVAILABLE", "message": str(exc)}}
                )
            )
            return 1
        failed += report(index, path, image, result)
    return 1 if failed else 0
