"""Untrusted dataset files are bounded before they are read (runner.dataset_limits, reading):
the memory reading them takes stays small whatever they claim or inflate to, and every
refusal names its limit and setting."""

from __future__ import annotations

import base64
import gzip
import io
import json
import struct
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.errors import GatewayError
from gateway.jobs.runner import reading, sources, tfrecord
from gateway.jobs.runner.dataset_limits import MIB, ItemCount, LimitExceeded, Limits

SMALL = Limits(max_image_bytes=1 * MIB, max_items=1000, max_input_files=10)


def peak(run: Callable[[], Any]) -> tuple[Any, int]:
    """What `run` returns, and the most memory Python held for it meanwhile."""
    tracemalloc.start()
    try:
        found = run()
        return found, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def gzip_of_zeros(path: Path, size: int, chunk: bytes = b"0" * MIB) -> None:
    with gzip.open(path, "wb", compresslevel=9) as out:
        for _ in range(size // len(chunk)):
            out.write(chunk)


def all_items(dataset: sources.Dataset, count: ItemCount | None = None) -> list[sources.Item]:
    (unit,) = sources.units(dataset, 0, 1)
    return list(sources.items(dataset, unit, 0, count))


def test_a_gzip_manifest_of_64_mib_of_zeros_is_one_skipped_line_in_bounded_memory(
    tmp_path: Path,
) -> None:
    manifest = tmp_path / "m.jsonl.gz"
    gzip_of_zeros(manifest, 64 * MIB)
    assert manifest.stat().st_size < 100_000
    dataset = sources.discover(str(manifest), limits=SMALL)
    items, used = peak(lambda: all_items(dataset))
    assert len(items) == 1 and items[0].error is not None
    assert items[0].error.code == "INVALID_ARGUMENT"
    assert "GATEWAY_MAX_IMAGE_BYTES" in items[0].error.message
    assert "line 1 is longer than" in items[0].error.message
    assert used < 3 * SMALL.max_line_bytes + 4 * MIB, used


def test_past_the_decompressed_limit_the_job_stops_naming_the_setting(tmp_path: Path) -> None:
    manifest = tmp_path / "m.jsonl.gz"
    gzip_of_zeros(manifest, 64 * MIB, chunk=b"{}\n" * (MIB // 3))
    limits = Limits(max_decompressed_bytes=16 * MIB)
    dataset = sources.discover(str(manifest), limits=limits)
    with pytest.raises(LimitExceeded, match="GATEWAY_BATCH_MAX_DECOMPRESSED_BYTES") as info:
        all_items(dataset)
    assert str(manifest) in str(info.value) and info.value.error().code == "RESOURCE_EXHAUSTED"


def test_a_manifest_of_32_mib_of_newlines_stops_before_one_line_is_made(tmp_path: Path) -> None:
    manifest = tmp_path / "m.jsonl"
    manifest.write_bytes(b"\n" * (32 * MIB))
    dataset = sources.discover(str(manifest), limits=Limits(max_items=1_000_000))
    (unit,) = sources.units(dataset, 0, 1)
    iterator = sources.items(dataset, unit)
    with pytest.raises(LimitExceeded, match="GATEWAY_BATCH_MAX_ITEMS_PER_JOB"):
        next(iterator)


def test_the_line_limit_counts_every_manifest_of_the_job(tmp_path: Path) -> None:
    for name in ("a.jsonl", "b.jsonl"):
        (tmp_path / name).write_text(
            "\n".join(json.dumps({"image_bytes": "YQ=="}) for _ in range(6))
        )
    dataset = sources.discover(str(tmp_path), limits=SMALL)
    count = ItemCount(Limits(max_items=10, items_setting="GATEWAY_BATCH_MAX_UPLOAD_IMAGES"))
    first, second = sources.units(dataset, 0, 1)
    assert len(list(sources.items(dataset, first, 0, count))) == 6
    with pytest.raises(LimitExceeded, match=r"more than 10 .*GATEWAY_BATCH_MAX_UPLOAD_IMAGES"):
        list(sources.items(dataset, second, 0, count))


def test_blank_and_overlong_lines_are_their_own_errors_and_the_others_read(tmp_path: Path) -> None:
    good = json.dumps({"image_bytes": base64.b64encode(b"img").decode(), "id": "g"})
    long = json.dumps({"image_bytes": "A" * (2 * SMALL.max_line_bytes)})
    (tmp_path / "m.jsonl").write_text("\n".join([good, "", long, "  ", good]) + "\n")
    items = all_items(sources.discover(str(tmp_path / "m.jsonl"), limits=SMALL))
    assert [i.index for i in items] == [0, 1, 2, 3, 4]
    assert [i.data for i in items] == [b"img", None, None, None, b"img"]
    assert "line 2 is empty" in items[1].error.message  # type: ignore[union-attr]
    assert "line 3 is longer than" in items[2].error.message  # type: ignore[union-attr]
    assert "line 4 is empty" in items[3].error.message  # type: ignore[union-attr]


def test_inline_image_bytes_over_the_image_limit_are_that_lines_error(tmp_path: Path) -> None:
    big = base64.b64encode(b"x" * (SMALL.max_image_bytes + 1)).decode()
    (tmp_path / "m.jsonl").write_text(json.dumps({"image_bytes": big}) + "\n")
    (item,) = all_items(sources.discover(str(tmp_path / "m.jsonl"), limits=SMALL))
    assert item.data is None and item.error is not None and item.error.code == "INVALID_ARGUMENT"
    assert "GATEWAY_MAX_IMAGE_BYTES" in item.error.message


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64])
def test_lines_split_across_chunks_as_bytes_split_does(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reading, "CHUNK", chunk)
    text = b"ab\n\ncdef\nghijklmnop\nq\n\nrs"
    stream = reading.BoundedStream(io.BytesIO(text), 1000, "t", Limits())
    got = list(reading.lines(stream, 4))
    assert got == [b"ab", b"", b"cdef", None, b"q", b"", b"rs"]
    stream = reading.BoundedStream(io.BytesIO(text), 1000, "t", Limits())
    assert reading.count_lines(stream) == len(got)


def forged_record(length: int) -> bytes:
    """A record header announcing `length` bytes, with a valid length checksum."""
    head = struct.pack("<Q", length)
    return head + struct.pack("<I", tfrecord.masked_crc(head)) + b"tiny"


def test_a_forged_record_length_is_refused_before_anything_is_allocated(tmp_path: Path) -> None:
    path = tmp_path / "d.tfrecord.gz"
    good = tfrecord.encode_record(b"not an example")
    path.write_bytes(gzip.compress(good + forged_record(1 << 40)))
    dataset = sources.discover(str(path), limits=SMALL)
    items, used = peak(lambda: all_items(dataset))
    assert len(items) == 2 and items[1].error is not None
    assert items[1].error.code == "DATA_LOSS"
    assert f"{1 << 40} bytes" in items[1].error.message
    assert "GATEWAY_MAX_IMAGE_BYTES" in items[1].error.message
    assert used < 8 * MIB, used


def test_tfrecord_records_count_against_the_jobs_limit(tmp_path: Path) -> None:
    path = tmp_path / "d.tfrecord"
    path.write_bytes(tfrecord.encode_record(b"") * 20)
    dataset = sources.discover(str(path), limits=Limits(max_items=5))
    with pytest.raises(LimitExceeded, match="more than 5"):
        all_items(dataset)


def sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def test_an_input_file_listed_over_the_image_limit_is_an_error_without_a_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sparse(tmp_path / "video.jpg", 3 << 30)
    (tmp_path / "ok.jpg").write_bytes(b"jpeg")
    dataset = sources.discover(str(tmp_path), limits=SMALL)
    items = all_items(dataset)
    assert [i.id for i in items] == ["ok.jpg", "video.jpg"]
    assert items[0].load is not None and items[0].load() == b"jpeg"
    error = items[1].error
    assert items[1].load is None and error is not None and error.code == "INVALID_ARGUMENT"
    assert f"{3 << 30} bytes" in error.message and "GATEWAY_MAX_IMAGE_BYTES" in error.message


def test_an_image_a_manifest_names_is_read_at_most_to_the_limit(tmp_path: Path) -> None:
    sparse(tmp_path / "big.png", 3 << 30)
    (tmp_path / "m.jsonl").write_text(json.dumps({"image": "big.png"}) + "\n")
    (item,) = all_items(sources.discover(str(tmp_path / "m.jsonl"), limits=SMALL))
    assert item.load is not None
    with pytest.raises(GatewayError) as info:
        item.load()
    assert info.value.code == "INVALID_ARGUMENT"
    assert "GATEWAY_MAX_IMAGE_BYTES" in info.value.message and "big.png" in info.value.message


def test_a_listing_past_the_files_limit_stops_there(tmp_path: Path) -> None:
    for index in range(SMALL.max_input_files + 1):
        (tmp_path / f"{index:03d}.jpg").write_bytes(b"x")
    with pytest.raises(LimitExceeded, match="GATEWAY_BATCH_MAX_INPUT_FILES"):
        sources.discover(str(tmp_path), limits=SMALL)
    with pytest.raises(LimitExceeded, match="GATEWAY_BATCH_MAX_INPUT_FILES"):
        sources.discover(str(tmp_path / "*.jpg"), limits=SMALL)
    assert len(sources.discover(str(tmp_path), limits=Limits()).files) == 11
