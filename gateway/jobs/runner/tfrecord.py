"""TFRecord files of tf.Example, read without TensorFlow.

A record is `uint64 length`, `uint32 masked_crc32c(length)`, `length` bytes of data,
`uint32 masked_crc32c(data)`, all little-endian (tensorflow/core/lib/io/record_writer.cc).
Both checksums are verified with google-crc32c.

Damage is reported per record, never as an exception:
- a data checksum that does not match: that record is an error (DATA_LOSS) and reading goes
  on with the next record, since the length told where it ends;
- a length whose checksum does not match, or a file that ends inside a record: the length
  cannot be trusted, so nothing after it can be framed. That position becomes one last error
  record and the rest of the file is not read. Scanning forward for something that looks
  like a record could frame image bytes as records and shift every later record's index,
  which is what ties an output line to its input record; TensorFlow's own reader also stops
  there (DataLossError).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import google_crc32c
from google.protobuf.message import DecodeError

from gateway.proto.tfswire.v1 import example_pb2

_MASK_DELTA = 0xA282EAD8
_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")


def masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


@dataclass(frozen=True)
class Record:
    """Record `index` of a file: its data, or why it could not be read."""

    index: int
    offset: int
    data: bytes | None
    error: str | None = None


class Readable(Protocol):
    def read(self, size: int, /) -> bytes: ...


def read_records(stream: Readable, max_length: int = 1 << 62) -> Iterator[Record]:
    """The records of a TFRecord stream, in order; damaged ones carry an error. A length
    field over `max_length` is refused before anything is allocated for it: like a length
    whose checksum is wrong, it ends the file (a forged length can carry a valid checksum)."""
    index = 0
    offset = 0
    while True:
        header = stream.read(_HEADER.size)
        if not header:
            return
        if len(header) < _HEADER.size:
            yield Record(index, offset, None, _truncated(offset, "its length header"))
            return
        length, length_crc = _HEADER.unpack(header)
        if masked_crc(header[:8]) != length_crc:
            yield Record(
                index,
                offset,
                None,
                f"record {index} at byte {offset}: its length field is corrupt (checksum "
                "mismatch), so the rest of the file cannot be framed and was not read",
            )
            return
        if length > max_length:
            yield Record(
                index,
                offset,
                None,
                f"record {index} at byte {offset}: its length field says {length} bytes, over "
                f"the limit of {max_length} bytes for one record (GATEWAY_MAX_IMAGE_BYTES plus "
                "1 MiB), so the rest of the file cannot be framed and was not read",
            )
            return
        data = stream.read(length)
        footer = stream.read(_FOOTER.size)
        if len(data) < length or len(footer) < _FOOTER.size:
            yield Record(index, offset, None, _truncated(offset, f"its {length} data bytes"))
            return
        if masked_crc(data) != _FOOTER.unpack(footer)[0]:
            yield Record(
                index,
                offset,
                None,
                f"record {index} at byte {offset}: data checksum mismatch ({length} bytes "
                "damaged); the record was skipped",
            )
        else:
            yield Record(index, offset, data)
        index += 1
        offset += _HEADER.size + length + _FOOTER.size


def _truncated(offset: int, what: str) -> str:
    return f"the file ends inside the record at byte {offset} (in {what}): truncated file"


def encode_record(data: bytes) -> bytes:
    """One framed record (for writing test files and fixtures)."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc(length)) + data + _FOOTER.pack(masked_crc(data))


@dataclass(frozen=True)
class ExampleImage:
    image: bytes
    source_id: str | None
    metadata: dict[str, object]


class ExampleError(ValueError):
    pass


IMAGE_KEY = "image/encoded"


def parse_example(data: bytes) -> ExampleImage:
    """The image, its id (`image/source_id`, else `image/filename`) and the other features
    (as JSON values: lists; bytes as UTF-8 text when they are, else left out) of a
    serialized tf.Example."""
    example = example_pb2.Example()
    try:
        example.ParseFromString(data)
    except DecodeError as e:
        raise ExampleError(f"the record is not a tf.Example ({e})") from None
    features = example.features.feature
    if IMAGE_KEY not in features or not features[IMAGE_KEY].bytes_list.value:
        names = ", ".join(sorted(features)) or "none"
        raise ExampleError(f"the tf.Example has no '{IMAGE_KEY}' bytes (features: {names})")
    image = features[IMAGE_KEY].bytes_list.value[0]
    metadata: dict[str, object] = {}
    for name in sorted(features):
        if name == IMAGE_KEY:
            continue
        feature = features[name]
        kind = feature.WhichOneof("kind")
        if kind == "bytes_list":
            try:
                metadata[name] = [v.decode() for v in feature.bytes_list.value]
            except UnicodeDecodeError:
                continue  # binary payloads (masks, other images) are not metadata
        elif kind == "float_list":
            metadata[name] = list(feature.float_list.value)
        elif kind == "int64_list":
            metadata[name] = list(feature.int64_list.value)
    source_id = None
    for key in ("image/source_id", "image/filename"):
        values = metadata.get(key)
        if isinstance(values, list) and values and values[0]:
            source_id = str(values[0])
            break
    return ExampleImage(image, source_id, metadata)
