"""Where a job started through the API may read (gateway.batch.access): normalised paths,
symlinks, schemes; the answer never depends on whether a location exists."""

from __future__ import annotations

from pathlib import Path

import fsspec
import pytest

from gateway.batch.access import Guard, fs_place, place
from gateway.errors import GatewayError, Kind


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "data" / "set").mkdir(parents=True)
    (tmp_path / "data" / "set" / "a.jpg").write_bytes(b"a")
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "key").write_bytes(b"k")
    (tmp_path / "data-other").mkdir()
    (tmp_path / "data" / "link").symlink_to(tmp_path / "secret")
    return tmp_path


def test_inside_the_prefix_after_normalising(tree: Path) -> None:
    guard = Guard.of([str(tree / "data")])
    assert guard.allows(place(str(tree / "data" / "set")))
    assert guard.allows(place(f"file://{tree}/data//set/./a.jpg"))
    assert guard.allows(place(str(tree / "data")))
    assert guard.allows(place(str(tree / "data" / "not-there-yet")))


@pytest.mark.parametrize(
    "relative",
    ["secret", "secret/key", "data/../secret", "data-other", "data/link", "data/link/key", "."],
)
def test_outside_whether_or_not_it_exists(tree: Path, relative: str) -> None:
    guard = Guard.of([str(tree / "data")])
    assert not guard.allows(place(str(tree / relative)))
    assert not guard.allows(place(str(tree / relative / "missing")))
    with pytest.raises(GatewayError) as first:
        guard.check_url(str(tree / relative), "input_uri")
    assert first.value.kind is Kind.PERMISSION_DENIED


@pytest.mark.parametrize(
    "url",
    [
        "/etc",
        "file:///etc/passwd",
        "http://169.254.169.254/latest/meta-data/",
        "https://example.com/data",
        "s3://bucket/data",  # another filesystem than the prefix's
        "simplecache::file:///data",
        "",
    ],
)
def test_other_places_and_schemes_are_refused(tree: Path, url: str) -> None:
    assert not Guard.of([str(tree / "data")]).allows(place(url))


def test_remote_prefixes_compare_scheme_and_normalised_path() -> None:
    guard = Guard.of(["s3://bucket/data", "gs://other"])
    assert guard.allows(place("s3://bucket/data/x.jpg"))
    assert guard.allows(place("s3a://bucket//data/x.jpg"))
    assert guard.allows(place("gcs://other/a/b"))
    assert not guard.allows(place("s3://bucket/data/../private/x"))
    assert not guard.allows(place("s3://bucket/database/x"))
    assert not guard.allows(place("gs://bucket/data/x"))
    memory = fsspec.filesystem("memory")
    assert not guard.allows(fs_place(memory, "/bucket/data/x"))


def test_a_loader_checks_again_before_reading(tree: Path) -> None:
    guard = Guard.of([str(tree / "data")])
    fs = fsspec.filesystem("file")
    target = tree / "data" / "set" / "b.jpg"
    target.write_bytes(b"b")
    load = guard.loader(fs, str(target), "input file")
    assert load() == b"b"
    target.unlink()
    target.symlink_to(tree / "secret" / "key")  # swapped for a link after the listing
    with pytest.raises(GatewayError) as info:
        load()
    assert info.value.kind is Kind.PERMISSION_DENIED and "b.jpg" in info.value.message
