"""Command-line flags of the gateway's clients (the client command, detection-batch): TLS to
the gateway, one flag per task option read from the bindings they are given, and the generic
`--option NAME=VALUE` (a task option by its field name, typed by the task's request message),
which is what the kubernetes executor passes to runner pods: one argv shape for every task."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from typing import Any

from google.protobuf.descriptor import FieldDescriptor

from gateway import errors
from gateway.api import pipelines
from gateway.api.bindings import Binding, Bindings
from gateway.tls import TLS


def add_tls_arguments(parser: argparse.ArgumentParser) -> None:
    """--tls, --ca-file, --cert-file, --key-file, --server-name (shared with other CLIs)."""
    group = parser.add_argument_group("TLS to the gateway")
    group.add_argument("--tls", action="store_true", help="use TLS (implied by the files)")
    group.add_argument("--ca-file", help="PEM CA bundle (default: the system roots)")
    group.add_argument("--cert-file", help="PEM client certificate chain (mTLS)")
    group.add_argument("--key-file", help="PEM private key of the client certificate")
    group.add_argument("--server-name", help="name expected in the gateway's certificate")


def tls_from_args(args: argparse.Namespace) -> TLS | None:
    if bool(args.cert_file) != bool(args.key_file):
        raise SystemExit("--cert-file and --key-file go together")
    if not (args.tls or args.ca_file or args.cert_file):
        return None
    return TLS(args.ca_file or None, args.cert_file or None, args.key_file or None,
               args.server_name or None)  # fmt: skip


def add_option_arguments(parser: argparse.ArgumentParser, bindings: Iterable[Binding]) -> None:
    """One flag per task option (--min-score, --max-detections, --top-k, ...); an option
    that only some tasks have says which."""
    bindings = list(bindings)
    having: dict[str, list[str]] = {}
    for binding in bindings:
        for name in binding.options:
            having.setdefault(name, []).append(binding.verb)
    for name, verbs in having.items():
        binding = next(each for each in bindings if name in each.options)
        field = binding.request_type.DESCRIPTOR.fields_by_name[name]
        floating = field.type in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE)
        kind: type = float if floating else int
        if field.type == FieldDescriptor.TYPE_STRING:  # e.g. segment's --mask-format
            kind = str
        text = binding.options[name]
        if len(verbs) < len(bindings):
            text += f"; {', '.join(verbs)} only"
        parser.add_argument(option_flag(name), dest=name, type=kind, default=kind(), help=text)


def add_task_arguments(parser: argparse.ArgumentParser, bindings: Bindings) -> None:
    """--task VERB (default: the first binding's) and --pipeline NAME, which runs a pipeline
    of the gateway's model config instead (check_pipeline_flags refuses what cannot go with
    it)."""
    parser.add_argument(
        "--task", choices=bindings.verbs, help=f"the task to run (default: {bindings.verbs[0]})"
    )
    parser.add_argument(
        "--pipeline",
        metavar="NAME",
        default="",
        help="run the gateway's pipeline NAME ([pipelines.NAME] of its model config) instead of "
        "a task: the first model's instances, each with what the steps found in its crop; "
        f"options: {', '.join(map(option_flag, pipelines.OPTIONS))}",
    )


def check_pipeline_flags(
    parser: argparse.ArgumentParser, args: argparse.Namespace, bindings: Bindings
) -> None:
    """With --pipeline, parser.error naming a task, a model or a task option it does not take
    (never dropped): the pipeline's config names its models and its steps' options."""
    if not args.pipeline:
        return
    named = [flag for flag, value in (("--task", args.task), ("--model", args.model),
             ("--version", args.version), ("--label", args.label))
             if value not in (None, "")]  # fmt: skip
    options = {name for binding in bindings for name in binding.options}
    named += [option_flag(n) for n in sorted(options - set(pipelines.OPTIONS)) if getattr(args, n)]
    if named:
        parser.error(
            f"{', '.join(named)} cannot go with --pipeline: the pipeline's config names its "
            f"models and its steps' options; a run takes "
            f"{' and '.join(map(option_flag, pipelines.OPTIONS))}"
        )


def option_flag(name: str) -> str:
    """An option's own flag (max_detections: --max-detections)."""
    return "--" + name.replace("_", "-")


OPTION = "--option"
_FLOATS = (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE)


def add_generic_option(parser: argparse.ArgumentParser) -> None:
    """--option NAME=VALUE, repeatable: any option of the task by its request message's field."""
    parser.add_argument(
        OPTION,
        dest="generic_options",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a task option by its field name in the task's request message (min_score=0.4, "
        "top_k=3, mask_format=polygon), typed as that field; repeatable. The same as the "
        "option's own flag; the kubernetes executor passes options this way",
    )


def option_args(options: Mapping[str, Any]) -> list[str]:
    """The `--option=NAME=VALUE` arguments of the options set (0, "" and false are the
    model's defaults and are left out), in name order: what runner pods are given."""
    args = []
    for name, value in sorted(options.items()):
        if value:
            text = ("true" if value else "false") if isinstance(value, bool) else str(value)
            args.append(f"{OPTION}={name}={text}")
    return args


def parse_options(binding: Binding, pairs: Iterable[str]) -> dict[str, Any]:
    """The options of `--option NAME=VALUE` pairs, each typed by the field of the task's
    request message; GatewayError INVALID_INPUT naming the pair for an option the task does
    not have, a value its field cannot hold, or an option given twice."""
    found: dict[str, Any] = {}
    for pair in pairs:
        name, equals, text = pair.partition("=")
        name = name.strip()
        if not equals or not name:
            raise errors.invalid_input(f"{OPTION} {pair!r}: write NAME=VALUE, e.g. min_score=0.4")
        if name not in binding.options:
            raise errors.invalid_input(
                f"{OPTION} {pair!r}: {name} is not an option of task {binding.verb} (its "
                f"options: {', '.join(binding.options) or 'none'})"
            )
        if name in found:
            raise errors.invalid_input(f"{OPTION} {name} is given twice")
        found[name] = _typed(binding, name, text, pair)
    return found


def _typed(binding: Binding, name: str, text: str, pair: str) -> Any:
    field = binding.request_type.DESCRIPTOR.fields_by_name[name]
    try:
        if field.type in _FLOATS:
            return float(text)
        if field.type == FieldDescriptor.TYPE_BOOL:
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError("true or false")
            return text.lower() in ("true", "1")
        if field.type == FieldDescriptor.TYPE_STRING:
            return text
        if field.type == FieldDescriptor.TYPE_ENUM and field.enum_type is not None:
            value = field.enum_type.values_by_name.get(text)
            return value.number if value is not None else int(text)
        return int(text)
    except ValueError:
        kind = {FieldDescriptor.TYPE_BOOL: "true or false"}.get(
            field.type, "a number" if field.type in _FLOATS else "an integer"
        )
        raise errors.invalid_input(
            f"{OPTION} {pair!r}: {name} of task {binding.verb} takes {kind}"
        ) from None
