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

import posixpath
from collections.abc import Iterator
from typing import Any

from gateway.errors import GatewayError, Kind
from gateway.jobs.runner import manifest, reading, storage, tfrecord
from gateway.jobs.runner.access import Guard
from gateway.jobs.runner.dataset import (
    Dataset,
    DatasetError,
    InputFile,
    Item,
    ReadError,
    Unit,
    check_size,
    invalid,
    loader,
)
from gateway.jobs.runner.dataset_limits import ItemCount, Limits
from gateway.jobs.runner.storage import Location, StorageError

__all__ = ["Dataset", "DatasetError", "InputFile", "Item", "ReadError", "Unit", "invalid"]

IMAGES, MANIFEST, TFRECORD = "images", "manifest", "tfrecord"
FORMATS = (IMAGES, MANIFEST, TFRECORD)
_TFRECORD_SUFFIXES = (".tfrecord", ".tfrecords", ".tfrec", ".record")
_MANIFEST_SUFFIXES = (".jsonl", ".ndjson", ".manifest")
_COMPRESSED = (".gz", ".bz2", ".xz", ".zst")


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


def discover(
    url: str, form: str = "auto", guard: Guard | None = None, limits: Limits | None = None
) -> Dataset:
    """The dataset at `url`; raises DatasetError for a missing, empty or mixed one and
    LimitExceeded past its files' limit (listing stops there). With a guard, `url` and every
    file found must be where it allows (GatewayError PERMISSION_DENIED, checked before
    anything is read)."""
    limits = limits or Limits()
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
            if len(entries) > limits.max_input_files:
                raise limits.too_many_files(url)
        elif fs.isfile(path):
            root = posixpath.dirname(path)
            entries = {path: fs.info(path)}
        elif fs.isdir(path):
            root = path
            entries = _walk(fs, path, url, limits)
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
    return Dataset(Location(fs, root), form, files, guard, limits)


def _walk(fs: Any, path: str, url: str, limits: Limits) -> dict[str, Any]:
    """Every file below `path` with its details, directory by directory, stopping past the
    files' limit (a listing of millions of objects is never held whole)."""
    entries: dict[str, Any] = {}
    for _root, _dirs, files in fs.walk(path, detail=True):
        for name, info in files.items():
            entries[info.get("name", name)] = info
        if len(entries) > limits.max_input_files:
            raise limits.too_many_files(url)
    return entries


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


def items(
    dataset: Dataset, unit: Unit, start: int = 0, count: ItemCount | None = None
) -> Iterator[Item]:
    """The unit's items from index `start` on (blocking I/O: run it in a thread). Manifest
    lines and TFRecord records read are counted in `count` (LimitExceeded past its limit)."""
    count = count or ItemCount(dataset.limits)
    if dataset.format == IMAGES:
        yield from _image_items(dataset, unit, start)
    elif dataset.format == MANIFEST:
        yield from manifest.items(dataset, unit.files[0], start, count)
    else:
        yield from _tfrecord_items(dataset, unit.files[0], start, count)


def _image_items(dataset: Dataset, unit: Unit, start: int) -> Iterator[Item]:
    fs = dataset.location.fs
    for index in range(start, len(unit.files)):
        f = unit.files[index]
        url = dataset.location.url(f.path)
        position = (index + 1) / len(unit.files)
        if f.size > dataset.limits.max_image_bytes:
            error = dataset.limits.image_too_large(f.size, f"input file {url}")
            yield Item(index, f.key, url, error=error, position=position)
            continue
        load = loader(dataset, dataset.guard, fs, f.path, "input file", f.size)
        yield Item(index, f.key, url, load=load, position=position)


def _tfrecord_items(dataset: Dataset, f: InputFile, start: int, count: ItemCount) -> Iterator[Item]:
    url = dataset.location.url(f.path)
    compressed = f.key.endswith(_COMPRESSED)
    limits = dataset.limits
    check_size(dataset, f)
    try:
        with reading.open_bounded(dataset.location.fs, f.path, url, limits) as stream:
            for record in tfrecord.read_records(stream, limits.max_record_bytes):
                count.take(url)
                if record.index < start:
                    continue
                item = _tfrecord_item(record, f"{url}#{record.index}")
                if not compressed and f.size:
                    item.position = min(1.0, (record.offset + len(record.data or b"")) / f.size)
                yield item
    except reading.DAMAGED as e:
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
