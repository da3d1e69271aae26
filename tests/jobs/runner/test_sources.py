"""Dataset discovery, the manifest and directory readers, and sharding."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from gateway.jobs.runner import sources
from gateway.jobs.runner.sources import DatasetError


def images_dir(root: Path, names: list[str]) -> Path:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(name.encode())
    return root


def test_directory_lists_every_object_sorted_with_keys_relative_to_input(tmp_path: Path) -> None:
    root = images_dir(tmp_path / "in", ["b.jpg", "a.png", "sub/c.jpg", "sub/a/d.gif", ".hidden"])
    dataset = sources.discover(str(root))
    assert dataset.format == sources.IMAGES
    keys = [".hidden", "a.png", "b.jpg", "sub/a/d.gif", "sub/c.jpg"]
    assert [f.key for f in dataset.files] == keys
    (unit,) = sources.units(dataset, 0, 1)
    assert unit.name == "results-00000-of-00001.jsonl"
    items = list(sources.items(dataset, unit))
    assert [i.id for i in items] == [f.key for f in dataset.files]
    assert [i.index for i in items] == [0, 1, 2, 3, 4]
    assert items[3].load is not None and items[3].load() == b"sub/a/d.gif"
    assert items[3].source == str(root / "sub/a/d.gif")
    assert [i.id for i in sources.items(dataset, unit, start=3)] == ["sub/a/d.gif", "sub/c.jpg"]


def test_glob_and_file_urls(tmp_path: Path) -> None:
    root = images_dir(tmp_path / "in", ["x/1.jpg", "x/2.png", "y/3.jpg"])
    dataset = sources.discover(f"file://{root}/*/*.jpg")
    assert [f.key for f in dataset.files] == ["x/1.jpg", "y/3.jpg"]


def test_missing_and_empty_inputs_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="does not exist"):
        sources.discover(str(tmp_path / "nothing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="is empty"):
        sources.discover(str(tmp_path / "empty"))
    with pytest.raises(DatasetError, match="is empty"):
        sources.discover(str(tmp_path / "*.jpg"))


def test_format_is_guessed_from_names_unless_given(tmp_path: Path) -> None:
    images_dir(tmp_path / "t", ["a.tfrecord", "b.tfrecord-00001-of-00002", "c.tfrecords.gz"])
    images_dir(tmp_path / "m", ["a.jsonl", "b.ndjson"])
    images_dir(tmp_path / "mixed", ["a.jsonl", "b.jpg"])
    assert sources.discover(str(tmp_path / "t")).format == sources.TFRECORD
    assert sources.discover(str(tmp_path / "m")).format == sources.MANIFEST
    assert sources.discover(str(tmp_path / "mixed")).format == sources.IMAGES
    assert sources.discover(str(tmp_path / "m"), "images").format == sources.IMAGES


def test_manifest_lines_paths_bytes_ids_metadata_and_bad_lines(tmp_path: Path) -> None:
    images_dir(tmp_path / "data" / "imgs", ["a.jpg"])
    (tmp_path / "elsewhere.jpg").write_bytes(b"abs")
    lines = [
        json.dumps({"image": "imgs/a.jpg", "label": "cat"}),
        json.dumps({"image_bytes": base64.b64encode(b"raw").decode(), "id": "x-1"}),
        "{broken",
        json.dumps({"image": f"file://{tmp_path / 'elsewhere.jpg'}", "id": 7}),
        json.dumps(["not", "an", "object"]),
        json.dumps({"image_bytes": "***"}),
        json.dumps({"label": "no image"}),
        json.dumps({"image": "imgs/a.jpg", "image_bytes": "YQ=="}),
        "",
        json.dumps({"image": "imgs/missing.jpg"}),
    ]
    (tmp_path / "data" / "m.jsonl").write_text("\n".join(lines) + "\n")
    dataset = sources.discover(str(tmp_path / "data" / "m.jsonl"))
    assert dataset.format == sources.MANIFEST
    (unit,) = sources.units(dataset, 0, 1)
    assert unit.name == "m.jsonl.jsonl"
    items = list(sources.items(dataset, unit))
    assert len(items) == len(lines)
    assert [i.index for i in items] == list(range(len(lines)))
    assert [i.id for i in items] == [0, "x-1", 2, 7, 4, 5, 6, 7, 8, 9]
    assert items[0].metadata == {"label": "cat"} and items[0].load is not None
    assert items[0].load() == b"a.jpg" and items[0].source == str(tmp_path / "data/imgs/a.jpg")
    assert items[1].data == b"raw" and items[1].metadata == {}
    assert items[3].load is not None and items[3].load() == b"abs"
    for bad in (2, 4, 5, 6, 7, 8):
        error = items[bad].error
        assert error is not None and error.code == "INVALID_ARGUMENT", bad
    assert "line 3" in items[2].error.message  # type: ignore[union-attr]
    assert items[9].load is not None
    with pytest.raises(FileNotFoundError):
        items[9].load()
    assert [i.index for i in sources.items(dataset, unit, start=8)] == [8, 9]


@pytest.mark.parametrize("count", [0, 1, 5, 7, 100, 1001])
@pytest.mark.parametrize("shards", [1, 2, 3, 8])
def test_shards_take_contiguous_blocks_covering_everything_once(count: int, shards: int) -> None:
    ranges = [sources.shard_range(count, i, shards) for i in range(shards)]
    assert [n for r in ranges for n in r] == list(range(count))
    sizes = [len(r) for r in ranges]
    assert max(sizes) - min(sizes) <= 1


def test_units_per_shard_for_images_and_files(tmp_path: Path) -> None:
    images = images_dir(tmp_path / "i", [f"{n:02d}.jpg" for n in range(10)])
    files = images_dir(tmp_path / "t", [f"part-{n}.tfrecord" for n in range(5)])
    image_set, file_set = sources.discover(str(images)), sources.discover(str(files))
    image_units = [sources.units(image_set, i, 3) for i in range(3)]
    assert [u.name for (u,) in image_units] == [f"results-{i:05d}-of-00003.jsonl" for i in range(3)]
    assert [f.key for (u,) in image_units for f in u.files] == [f"{n:02d}.jpg" for n in range(10)]
    names = [[u.name for u in sources.units(file_set, i, 3)] for i in range(3)]
    assert names == [["part-0.tfrecord.jsonl"], ["part-1.tfrecord.jsonl", "part-2.tfrecord.jsonl"],
                     ["part-3.tfrecord.jsonl", "part-4.tfrecord.jsonl"]]  # fmt: skip
