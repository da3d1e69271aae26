"""JSON Lines manifests: one item per line, `{"image": <path or URL>, ...}` or
`{"image_bytes": <base64>, ...}`, the line's other fields kept as its metadata.

A manifest is read twice, streamed both times: first its lines are counted (at C speed, the
job's limit on lines checked before one result is written), then they are read one by one,
each line capped (a longer one is skipped unread and becomes that line's error). Output line
k is manifest line k, blank lines included (their error says so).
"""

from __future__ import annotations

import base64
import binascii
import json
import posixpath
from collections.abc import Iterator
from typing import Any

import fsspec

from gateway.jobs.runner import reading
from gateway.jobs.runner.access import Guard, fs_place
from gateway.jobs.runner.dataset import (
    Dataset,
    InputFile,
    Item,
    ReadError,
    check_size,
    invalid,
    loader,
)
from gateway.jobs.runner.dataset_limits import ItemCount


def items(dataset: Dataset, f: InputFile, start: int, count: ItemCount) -> Iterator[Item]:
    """The manifest's items from line index `start` on."""
    url = dataset.location.url(f.path)
    fs, limits = dataset.location.fs, dataset.limits
    check_size(dataset, f)
    try:
        with reading.open_bounded(fs, f.path, url, limits) as stream:
            total = reading.count_lines(stream)
    except reading.DAMAGED as e:
        raise ReadError(f"cannot read manifest {url}: {e}") from None
    count.take(url, total)  # every line, the ones a resumed run skips included
    base = posixpath.dirname(f.path)
    guard = dataset.guard
    if guard is not None:  # the manifest's own directory is allowed too
        guard = guard.with_places([fs_place(fs, base)])
    filesystems: dict[str, Any] = {}
    try:
        with reading.open_bounded(fs, f.path, url, limits) as stream:
            for number, raw in enumerate(reading.lines(stream, limits.max_line_bytes)):
                if number >= total:
                    return  # the file grew since it was counted: the rest is not read
                if number < start:
                    continue
                if raw is None:
                    item = Item(number, number, f"{url}:{number + 1}")
                    item.error = invalid(limits.line_too_long(number + 1))
                else:
                    item = _item(dataset, raw, number, base, url, filesystems, guard)
                item.position = (number + 1) / total
                yield item
    except reading.DAMAGED as e:
        raise ReadError(f"cannot read manifest {url}: {e}") from None


def _item(
    dataset: Dataset,
    raw: bytes,
    number: int,
    base: str,
    manifest_url: str,
    filesystems: dict[str, Any],
    guard: Guard | None,
) -> Item:
    source = f"{manifest_url}:{number + 1}"  # line numbers as editors show them
    if not raw.strip():
        return Item(number, number, source, error=invalid(f"line {number + 1} is empty"))
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
            return item
        if len(item.data) > dataset.limits.max_image_bytes:
            size = len(item.data)
            item.data = None
            item.error = dataset.limits.image_too_large(size, f"line {number + 1}: image_bytes")
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
        item.load = loader(dataset, guard, fs, path, f"line {number + 1}: image")
    else:
        item.error = invalid(
            f"line {number + 1} needs exactly one of 'image' (a path or URI, relative to the "
            "manifest) and 'image_bytes' (base64), as a non-empty string"
        )
    return item


def _same_scheme(fs: Any, protocol: str) -> bool:
    own = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return protocol.lower() in own
