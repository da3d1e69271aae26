"""The TFRecord reader against files written by TensorFlow itself."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from gateway.jobs.runner import sources, tfrecord
from tests.support import tools

tf = tools.module("tensorflow", "the serving extra (make venv)")


def tf_example(image: bytes, **features: object) -> bytes:
    feature = {"image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image]))}
    for name, value in features.items():
        key = name.replace("__", "/")
        if isinstance(value, bytes):
            feature[key] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
        elif isinstance(value, float):
            feature[key] = tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
        else:
            feature[key] = tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
    example = tf.train.Example(features=tf.train.Features(feature=feature))
    return bytes(example.SerializeToString())


def write(path: Path, records: list[bytes], compression: str | None = None) -> Path:
    options = tf.io.TFRecordOptions(compression_type=compression) if compression else None
    with tf.io.TFRecordWriter(str(path), options) as writer:
        for record in records:
            writer.write(record)
    return path


def read(path: Path) -> list[tfrecord.Record]:
    with path.open("rb") as f:
        return list(tfrecord.read_records(f))


def test_records_written_by_tensorflow_read_back_identically(tmp_path: Path) -> None:
    records = [tf_example(bytes([i]) * (i * 37 + 1), image__height=i) for i in range(20)]
    records.append(b"")  # an empty record is a valid record
    path = write(tmp_path / "a.tfrecord", records)
    found = read(path)
    assert [r.data for r in found] == records
    assert [r.index for r in found] == list(range(21))
    assert all(r.error is None for r in found)


def test_example_fields_id_and_metadata(tmp_path: Path) -> None:
    with_source = tf_example(b"img0", image__source_id=b"src-0", image__filename=b"f0.jpg")
    with_filename = tf_example(b"img1", image__filename=b"f1.jpg", image__width=640)
    bare = tf_example(b"img2", image__class__score=0.5)
    a = tfrecord.parse_example(with_source)
    b = tfrecord.parse_example(with_filename)
    c = tfrecord.parse_example(bare)
    assert (a.image, a.source_id) == (b"img0", "src-0")
    assert (b.image, b.source_id) == (b"img1", "f1.jpg")
    assert b.metadata == {"image/filename": ["f1.jpg"], "image/width": [640]}
    assert (c.image, c.source_id, c.metadata) == (b"img2", None, {"image/class/score": [0.5]})


def test_corrupt_data_crc_is_that_records_error_and_reading_goes_on(tmp_path: Path) -> None:
    records = [tf_example(b"x" * 100) for _ in range(3)]
    path = write(tmp_path / "a.tfrecord", records)
    data = bytearray(path.read_bytes())
    second = 12 + len(records[0]) + 4  # start of record 1
    data[second + 12 + 10] ^= 0x01
    path.write_bytes(bytes(data))
    found = read(path)
    assert [r.data for r in found] == [records[0], None, records[2]]
    assert found[1].error is not None and "data checksum mismatch" in found[1].error


def test_corrupt_length_stops_the_file_with_one_error(tmp_path: Path) -> None:
    records = [tf_example(b"y" * 50) for _ in range(4)]
    path = write(tmp_path / "a.tfrecord", records)
    data = bytearray(path.read_bytes())
    third = 2 * (12 + len(records[0]) + 4)
    data[third] ^= 0x40  # the length of record 2
    path.write_bytes(bytes(data))
    found = read(path)
    assert [r.data for r in found[:2]] == records[:2]
    assert len(found) == 3 and found[2].data is None
    assert found[2].error is not None and "length field is corrupt" in found[2].error


@pytest.mark.parametrize("cut", [5, 12, 40, -2])
def test_truncated_file_ends_with_an_error_record(tmp_path: Path, cut: int) -> None:
    records = [tf_example(b"z" * 60) for _ in range(2)]
    path = write(tmp_path / "a.tfrecord", records)
    whole = path.read_bytes()
    start = 12 + len(records[0]) + 4
    path.write_bytes(whole[: start + cut] if cut > 0 else whole[:cut])
    found = read(path)
    assert found[0].data == records[0]
    assert len(found) == 2 and found[1].data is None
    assert found[1].error is not None and "truncated" in found[1].error


def test_gzip_tfrecord_through_the_dataset_reader(tmp_path: Path) -> None:
    records = [tf_example(f"img{i}".encode(), image__source_id=f"id{i}".encode()) for i in range(5)]
    (tmp_path / "data").mkdir()
    write(tmp_path / "data" / "p.tfrecord.gz", records, "GZIP")
    dataset = sources.discover(str(tmp_path / "data"))
    assert dataset.format == sources.TFRECORD
    (unit,) = sources.units(dataset, 0, 1)
    assert unit.name == "p.tfrecord.gz.jsonl"
    items = list(sources.items(dataset, unit))
    assert [(i.id, i.data) for i in items] == [(f"id{i}", f"img{i}".encode()) for i in range(5)]
    assert [i.id for i in sources.items(dataset, unit, start=3)] == ["id3", "id4"]


def test_not_an_example_and_missing_image_are_item_errors(tmp_path: Path) -> None:
    name = tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"a"]))
    no_image = tf.train.Example(
        features=tf.train.Features(feature={"image/filename": name})
    ).SerializeToString()
    (tmp_path / "d").mkdir()
    write(tmp_path / "d" / "x.tfrecord", [b"\xff\xff\xff garbage", no_image, tf_example(b"ok")])
    dataset = sources.discover(str(tmp_path / "d"))
    items = list(sources.items(dataset, sources.units(dataset, 0, 1)[0]))
    assert items[0].error is not None and items[0].error.code == "INVALID_ARGUMENT"
    assert "not a tf.Example" in items[0].error.message
    assert items[1].error is not None and "no 'image/encoded'" in items[1].error.message
    assert items[2].error is None and items[2].data == b"ok" and items[2].id == 2


def test_encode_record_matches_tensorflow(tmp_path: Path) -> None:
    payload = tf_example(b"same bytes")
    path = write(tmp_path / "a.tfrecord", [payload])
    assert tfrecord.encode_record(payload) == path.read_bytes()
    assert list(tfrecord.read_records(io.BytesIO(b""))) == []
