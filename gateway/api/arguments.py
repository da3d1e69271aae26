"""Command-line flags of the gateway's clients (the client command, detection-batch): TLS to
the gateway, and one flag per task option, read from the bindings they are given."""

from __future__ import annotations

import argparse

from google.protobuf.descriptor import FieldDescriptor

from gateway.api.bindings import Bindings
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


def add_option_arguments(parser: argparse.ArgumentParser, bindings: Bindings) -> None:
    """One flag per task option (--min-score, --max-detections, --top-k, ...); an option
    that only some tasks have says which."""
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
        parser.add_argument(
            "--" + name.replace("_", "-"), dest=name, type=kind, default=kind(), help=text
        )
