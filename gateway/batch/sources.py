"""Datasets: what INPUT holds (images, JSON Lines manifests, TFRecords), how it is split into
output files and shards, and the items each output file covers, in order.

INPUT is a directory or prefix (every object below it, sorted by key), a glob, or one file.
The format is guessed from the file names unless given: all TFRecords -> TFRecord, all
manifests -> manifest, anything else -> images.

Output files: one per TFRecord or manifest file (its path relative to INPUT, plus `.jsonl`),
or, for images, one per shard (`results-SSSSS-of-NNNNN.jsonl`). Shards take contiguous
blocks of the sorted files (`shard_range`), so reading the outputs in name order gives the
inputs in key order.
"""

from __future__ import annotations

import base64
import binascii
import json
import posixpath
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import fsspec

from gateway.batch import storage, tfrecord
from gateway.batch.access import Guard, fs_place
from gateway.batch.storage import Location, StorageError
from gateway.errors import GatewayError, Kind

IMAGES, MANIFEST, TFRECORD = "images", "manifest", "tfrecord"
FORMATS = (IMAGES, MANIFEST, TFRECORD)
_TFRECORD_SUFFIXES = (".tfrecord", ".tfrecords", ".tfrec", ".record")
_MANIFEST_SUFFIXES = (".jsonl", ".ndjson", ".manifest")
_COMPRESSED = (".gz", ".bz2", ".xz", ".zst")


class DatasetError(Exception):
    """INPUT cannot be used as a dataset; the message says why and what to do."""


class ReadError(Exception):
    """A manifest or TFRecord file could not be read during the run (storage trouble that
    may pass: the run stops, resumable)."""


@dataclass(frozen=True)
class InputFile:
    path: str  # on the dataset's filesystem
    key: str  # relative to INPUT's root
    size: int


@dataclass(frozen=True)
class Dataset:
    location: Location  # the root: INPUT itself, or the directory a glob or file is in
    format: str
    files: tuple[InputFile, ...]
    guard: Guard | None = None  # where items may be read from (jobs started by the API)

    def fingerprint(self) -> list[list[object]]:
        """What a resumed run must find again: every file's key and size."""
        return [[f.key, f.size] for f in self.files]


@dataclass(frozen=True)
class Unit:
    """One output file and the input files whose items it holds, in order."""

    name: str  # relative to OUTPUT
    files: tuple[InputFile, ...]


@dataclass
class Item:
    """One image to send: its bytes (or how to load them), or why it cannot be sent."""

    index: int  # line number in the unit's output
    id: object
    source: str
    metadata: dict[str, Any] = field(default_factory=dict)
    data: bytes | None = None
    load: Callable[[], bytes] | None = None
    error: GatewayError | None = None
    # How much of the unit's input is read once this item is (0..1], for progress estimates.
    position: float = 0.0


def _strip_compression(name: str) -> str:
    for suffix in _COMPRESSED:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def is_tfrecord(name: str) -> bool:
    base = _strip_compression(posixpath.basename(name)).lower()
    return base.endswith(_TFRECORD_SUFFIXES) or ".tfrecord-" in base or ".tfrecords-" in base


def is_manifest(name: str) -> bool:
    return _strip_compression(posixpath.basename(name)).lower().endswith(_MANIFEST_SUFFIXES)


def discover(url: str, form: str = "auto", guard: Guard | None = None) -> Dataset:
    """The dataset at `url`; raises DatasetError for a missing, empty or mixed one. With a
    guard, `url` and every file found must be where it allows (GatewayError
    PERMISSION_DENIED, checked before anything is read)."""
    if guard is not None:
        guard.check_url(url, "input_uri")
    try:
        location = storage.resolve(url)
    except StorageError as e:
        raise DatasetError(str(e)) from None
    fs, path = location.fs, location.path
    try:
        if has_glob(path):
            root = _glob_root(path)
            found = fs.glob(path, detail=True)
            entries = {p: info for p, info in found.items() if info.get("type") != "directory"}
        elif fs.isfile(path):
            root = posixpath.dirname(path)
            entries = {path: fs.info(path)}
        elif fs.isdir(path):
            root = path
            entries = fs.find(path, detail=True)
        else:
            raise DatasetError(f"INPUT {url} does not exist (no file, directory or prefix)")
    except (OSError, PermissionError) as e:
        raise DatasetError(f"cannot list INPUT {url}: {e}") from None
    files = tuple(
        InputFile(p, posixpath.relpath(p, root), int(info.get("size") or 0))
        for p, info in sorted(entries.items())
    )
    if guard is not None:
        for f in files:
            guard.check_file(fs, f.path, "input file")
    if not files:
        raise DatasetError(f"INPUT {url} is empty: no files to read")
    if form == "auto":
        if all(is_tfrecord(f.key) for f in files):
            form = TFRECORD
        elif all(is_manifest(f.key) for f in files):
            form = MANIFEST
        else:
            form = IMAGES
    elif form not in FORMATS:
        raise DatasetError(f"--format must be one of auto, {', '.join(FORMATS)}; got {form!r}")
    return Dataset(Location(fs, root), form, files, guard)


def has_glob(path: str) -> bool:
    return any(c in storage.GLOB_CHARS for c in path)


def _glob_root(pattern: str) -> str:
    parts = pattern.split("/")
    for i, part in enumerate(parts):
        if has_glob(part):
            return "/".join(parts[:i]) or "/"
    return posixpath.dirname(pattern)


def shard_range(count: int, index: int, shards: int) -> range:
    """The contiguous block of `count` sorted inputs that shard `index` of `shards` takes."""
    return range(index * count // shards, (index + 1) * count // shards)


def units(dataset: Dataset, shard_index: int, shard_count: int) -> list[Unit]:
    """The output files shard `shard_index` writes, in order."""
    block = dataset.files[
        shard_range(len(dataset.files), shard_index, shard_count).start : shard_range(
            len(dataset.files), shard_index, shard_count
        ).stop
    ]
    if dataset.format == IMAGES:
        return [Unit(f"results-{shard_index:05d}-of-{shard_count:05d}.jsonl", block)]
    return [Unit(f.key + ".jsonl", (f,)) for f in block]


def items(dataset: Dataset, unit: Unit, start: int = 0) -> Iterator[Item]:
    """The unit's items from index `start` on (blocking I/O: run it in a thread)."""
    if dataset.format == IMAGES:
        yield from _image_items(dataset, unit, start)
    elif dataset.format == MANIFEST:
        yield from _manifest_items(dataset, unit.files[0], start)
    else:
        yield from _tfrecord_items(dataset, unit.files[0], start)


def _loader(guard: Guard | None, fs: Any, path: str, what: str) -> Callable[[], bytes]:
    if guard is not None:
        return guard.loader(fs, path, what)
    return lambda: storage.read_bytes(fs, path)


def _image_items(dataset: Dataset, unit: Unit, start: int) -> Iterator[Item]:
    fs = dataset.location.fs
    for index in range(start, len(unit.files)):
        f = unit.files[index]
        url = dataset.location.url(f.path)
        load = _loader(dataset.guard, fs, f.path, "input file")
        yield Item(index, f.key, url, load=load, position=(index + 1) / len(unit.files))


def _open(dataset: Dataset, f: InputFile) -> Any:
    return fsspec.open(dataset.location.url(f.path), "rb", compression="infer")


def _manifest_items(dataset: Dataset, f: InputFile, start: int) -> Iterator[Item]:
    manifest_url = dataset.location.url(f.path)
    try:
        with _open(dataset, f) as stream:
            text = stream.read()
    except OSError as e:
        raise ReadError(f"cannot read manifest {manifest_url}: {e}") from None
    lines = text.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the newline that ends the last line
    base = posixpath.dirname(f.path)
    guard = dataset.guard
    if guard is not None:  # the manifest's own directory is allowed too
        guard = guard.with_places([fs_place(dataset.location.fs, base)])
    filesystems: dict[str, Any] = {}
    for number in range(start, len(lines)):
        item = _manifest_item(
            dataset, lines[number], number, base, manifest_url, filesystems, guard
        )
        item.position = (number + 1) / len(lines)
        yield item


def _manifest_item(
    dataset: Dataset,
    raw: bytes,
    number: int,
    base: str,
    manifest_url: str,
    filesystems: dict[str, Any],
    guard: Guard | None,
) -> Item:
    source = f"{manifest_url}:{number + 1}"  # line numbers as editors show them
    try:
        entry = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        return Item(number, number, source, error=invalid(f"line {number + 1}: {e}"))
    if not isinstance(entry, dict):
        return Item(
            number, number, source, error=invalid(f"line {number + 1} is not a JSON object")
        )
    item_id = entry.pop("id", number)
    image = entry.pop("image", None)
    image_bytes = entry.pop("image_bytes", None)
    item = Item(number, item_id, source, metadata=entry)
    if isinstance(image_bytes, str) and image is None:
        try:
            item.data = base64.b64decode(image_bytes, validate=True)
        except (binascii.Error, ValueError) as e:
            item.error = invalid(f"line {number + 1}: image_bytes is not base64 ({e})")
    elif isinstance(image, str) and image and image_bytes is None:
        if "://" in image:
            protocol = image.split("://", 1)[0]
            if guard is not None and not _same_scheme(dataset.location.fs, protocol):
                item.error = guard.denied(f"line {number + 1}: image {image}")
                return item
            if protocol not in filesystems:
                filesystems[protocol] = fsspec.core.url_to_fs(image)[0]
            fs, path = filesystems[protocol], fsspec.core.strip_protocol(image)
            item.source = image
        else:
            fs, path = dataset.location.fs, posixpath.normpath(posixpath.join(base, image))
            item.source = dataset.location.url(path)
        if guard is not None and not guard.allows(fs_place(fs, path)):
            item.error = guard.denied(f"line {number + 1}: image {image}")
            return item
        item.load = _loader(guard, fs, path, f"line {number + 1}: image")
    else:
        item.error = invalid(
            f"line {number + 1} needs exactly one of 'image' (a path or URI, relative to the "
            "manifest) and 'image_bytes' (base64), as a non-empty string"
        )
    return item


def invalid(message: str) -> GatewayError:
    return GatewayError(Kind.INVALID_INPUT, message)


def _same_scheme(fs: Any, protocol: str) -> bool:
    own = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return protocol.lower() in own


def _tfrecord_items(dataset: Dataset, f: InputFile, start: int) -> Iterator[Item]:
    url = dataset.location.url(f.path)
    compressed = f.key.endswith(_COMPRESSED)
    try:
        with _open(dataset, f) as stream:
            for record in tfrecord.read_records(stream):
                if record.index < start:
                    continue
                item = _tfrecord_item(record, f"{url}#{record.index}")
                if not compressed and f.size:
                    item.position = min(1.0, (record.offset + len(record.data or b"")) / f.size)
                yield item
    except (OSError, EOFError) as e:
        raise ReadError(f"cannot read TFRecord file {url}: {e}") from None


def _tfrecord_item(record: tfrecord.Record, source: str) -> Item:
    index = record.index
    if record.error is not None:
        return Item(index, index, source, error=GatewayError(Kind.DATA_LOSS, record.error))
    assert record.data is not None
    try:
        example = tfrecord.parse_example(record.data)
    except tfrecord.ExampleError as e:
        return Item(index, index, source, error=invalid(str(e)))
    item_id = example.source_id if example.source_id is not None else index
    return Item(index, item_id, source, example.metadata, data=example.image)
