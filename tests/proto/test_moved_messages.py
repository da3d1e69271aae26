"""The messages that moved to vision.v1 encode as they did in detection.v1: the same bytes and
the same proto3 JSON both ways, so clients built against the first release and this gateway
understand each other (CHANGELOG.md, "Moving to vision.v1"; proto/buf.yaml accepts the change
of the `model` fields' type for this reason only).

The first release's detection.proto is compiled from git (proto/buf.yaml's API_BASE, as
`make lint` does); its batch.proto is the deprecated detection/v1/batch.proto, unchanged."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet
from google.rpc import status_pb2

from gateway.proto.detection.v1 import batch_pb2 as legacy_batch
from gateway.proto.detection.v1 import detection_pb2
from gateway.proto.vision.v1 import batch_pb2, model_pb2

ROOT = Path(__file__).resolve().parents[2]


def api_base() -> str:
    """The released API `buf breaking` compares against (the Makefile's API_BASE)."""
    for line in (ROOT / "Makefile").read_text().splitlines():
        if line.startswith("API_BASE ?="):
            return line.split("=", 1)[1].strip()
    raise AssertionError("the Makefile names no API_BASE")


@pytest.fixture(scope="module")
def first_release(tmp_path_factory: pytest.TempPathFactory) -> descriptor_pool.DescriptorPool:
    """A descriptor pool holding the first release's detection.v1 (from git, as released)."""
    base = tmp_path_factory.mktemp("api-base")
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", api_base(), "proto"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
    image = base / "api.binpb"
    subprocess.run(
        [sys.executable, str(ROOT / "proto" / "generate.py"), "--image", str(image),
         "--proto-dir", str(base / "proto")],
        check=True, capture_output=True,
    )  # fmt: skip
    files = descriptor_pb2.FileDescriptorSet.FromString(image.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:
        pool.Add(file)
    return pool


def filled(cls: type[Message], depth: int = 0) -> Message:
    """A message of `cls` with every field set (the first member of each oneof), messages
    nested three deep, so that every field number and type is on the wire."""
    message = cls()
    for field in message.DESCRIPTOR.fields:
        oneof = field.containing_oneof
        if oneof is not None and oneof.fields[0] is not field:
            continue
        if field.message_type is not None:
            if field.message_type.full_name == "google.protobuf.Any":
                into = getattr(message, field.name)
                into = into.add() if field.is_repeated else into
                # google.rpc.Status: a type both releases' descriptor pools hold.
                into.Pack(status_pb2.Status(code=5, message="packed"))
            elif field.message_type.GetOptions().map_entry:
                getattr(message, field.name)["key"] = _scalar(field.message_type.fields[1])
            elif field.message_type.full_name == "google.protobuf.Timestamp":
                getattr(message, field.name).FromSeconds(1_700_000_000)
            elif field.message_type.full_name in ("google.protobuf.Struct",):
                getattr(message, field.name).update({"shard": "a", "n": 3})
            elif depth < 3:
                inner = filled(message_factory.GetMessageClass(field.message_type), depth + 1)
                if field.is_repeated:
                    getattr(message, field.name).add().CopyFrom(inner)
                else:
                    getattr(message, field.name).CopyFrom(inner)
        elif field.is_repeated:
            getattr(message, field.name).append(_scalar(field))
        else:
            setattr(message, field.name, _scalar(field))
    return message


def _scalar(field: FieldDescriptor) -> object:
    if field.enum_type is not None:
        return field.enum_type.values[-1].number
    return {
        FieldDescriptor.CPPTYPE_STRING: b"\x01bytes" if field.type == field.TYPE_BYTES else "s",
        FieldDescriptor.CPPTYPE_BOOL: True,
        FieldDescriptor.CPPTYPE_FLOAT: 0.5,
        FieldDescriptor.CPPTYPE_DOUBLE: 0.25,
    }.get(field.cpp_type, 7)


def assert_same_encoding(old: Descriptor, new: Descriptor) -> None:
    """A filled message of each side reads back on the other as the same bytes and JSON.
    Fields `new` added since `old` (e.g. DetectionResult.error) are unknown to `old`: kept as
    unknown fields and re-sent as they came, and left out of the JSON comparison."""
    old_cls, new_cls = (message_factory.GetMessageClass(d) for d in (old, new))
    added = {f.json_name for f in new.fields} - {f.json_name for f in old.fields}
    for source, target in ((old_cls, new_cls), (new_cls, old_cls)):
        sent = filled(source)
        wire = sent.SerializeToString(deterministic=True)
        got = target.FromString(wire)
        assert got.SerializeToString(deterministic=True) == wire, (source, target)
        shown = {k: v for k, v in json_format.MessageToDict(sent).items() if k not in added}
        assert json_format.MessageToDict(got) == shown
        if target is new_cls:
            assert not len(UnknownFieldSet(got)), f"{new.full_name} has unknown fields"


@pytest.mark.parametrize("name", ["DetectRequest", "DetectionResult", "ModelSpec", "ServedModel"])
def test_detection_messages_encode_as_in_the_first_release(
    first_release: descriptor_pool.DescriptorPool, name: str
) -> None:
    old = first_release.FindMessageTypeByName(f"detection.v1.{name}")
    module = model_pb2 if name in ("ModelSpec", "ServedModel") else detection_pb2
    assert_same_encoding(old, getattr(module, name).DESCRIPTOR)


@pytest.mark.parametrize("name", sorted(legacy_batch.DESCRIPTOR.message_types_by_name))
def test_batch_messages_encode_as_under_their_first_name(name: str) -> None:
    assert_same_encoding(
        legacy_batch.DESCRIPTOR.message_types_by_name[name],
        batch_pb2.DESCRIPTOR.message_types_by_name[name],
    )


def test_both_batch_services_have_the_same_methods() -> None:
    def methods(module: object) -> list[tuple[str, str, str, bool, bool]]:
        service = module.DESCRIPTOR.services_by_name["BatchService"]  # type: ignore[attr-defined]
        return [
            (m.name, m.input_type.name, m.output_type.name, m.client_streaming,
             m.server_streaming)
            for m in service.methods
        ]  # fmt: skip

    assert methods(legacy_batch) == methods(batch_pb2)
    assert sorted(legacy_batch.DESCRIPTOR.message_types_by_name) == sorted(
        batch_pb2.DESCRIPTOR.message_types_by_name
    )
