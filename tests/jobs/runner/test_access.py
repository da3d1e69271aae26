"""Where a job started through the API may read (gateway.jobs.runner.access): normalised paths,
symlinks, schemes; the answer never depends on whether a location exists."""

from __future__ import annotations

from pathlib import Path

import fsspec
import pytest

from gateway.errors import GatewayError, Kind
from gateway.jobs.runner.access import Guard, fs_place, place


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


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:18081/secret#/../../allowed.example/public/x.png",
        "http://allowed.example/public/%2e%2e/admin/x.png",
        "http://allowed.example/public/%2E%2E/admin/x.png",
        "http://allowed.example/public%2f..%2fadmin/x.png",
        "http://allowed.example/public/../admin/x.png",
        "http://allowed.example/public/./x.png",
        "http://allowed.example/public\\..\\admin/x.png",
        "http://user@allowed.example/public/x.png",
        "http://allowed.example@127.0.0.1:18081/public/x.png",
        "http://allowed.example/public/x.png?u=/admin",
        "http://allowed.example:8080/public/x.png",
        "http://allowed.example.evil/public/x.png",
        "https://allowed.example/public/x.png",
        "http://allowed.example/public/x\x00.png",
    ],
)
def test_urls_that_read_one_way_and_fetch_another_are_no_places(url: str) -> None:
    guard = Guard.of(["http://allowed.example/public"])
    assert not guard.allows(place(url))
    with pytest.raises(GatewayError) as info:
        guard.check_place(url, "input_uri")
    assert info.value.kind is Kind.PERMISSION_DENIED


def test_urls_below_an_http_prefix_are_allowed_host_compared_exactly() -> None:
    guard = Guard.of(["http://Allowed.Example/public"])
    assert guard.check_place("http://allowed.example/public/a/x.png", "input_uri") == place(
        "HTTP://ALLOWED.EXAMPLE/public//a/x.png"
    )
    http = fsspec.filesystem("http")
    assert guard.allows(fs_place(http, "http://allowed.example/public/x.png"))
    assert not guard.allows(fs_place(http, "http://allowed.example/publicity/x.png"))


def test_nothing_in_or_holding_a_fence_is_allowed_but_below_a_prefix_inside_it(
    tree: Path,
) -> None:
    store = tree / "data" / "store"
    (store / "uploads" / "mine").mkdir(parents=True)
    (store / "uploads" / "theirs").mkdir(parents=True)
    (tree / "data" / "to-store").symlink_to(store)
    guard = Guard.of([str(tree / "data")], fences=[str(store)])
    own = guard.with_places([place(str(store / "uploads" / "mine"))])
    for g in (guard, own):
        assert g.allows(place(str(tree / "data" / "set" / "a.jpg")))
        for refused in (
            str(store),
            str(tree / "data"),  # holds the store
            str(store / "uploads" / "theirs" / "x.jpg"),
            str(tree / "data" / "to-store" / "uploads" / "theirs"),
            str(store / "uploads" / "mine" / ".." / "theirs" / "x.jpg"),
        ):
            assert not g.allows(place(refused)), refused
            with pytest.raises(GatewayError):
                g.check_place(refused, "input_uri")
        with pytest.raises(GatewayError):  # a glob whose fixed part holds the store
            g.check_place(f"{tree}/data/*/uploads/*", "input_uri")
    assert own.allows(place(str(store / "uploads" / "mine" / "x.jpg")))
    assert not guard.allows(place(str(store / "uploads" / "mine" / "x.jpg")))
    fs = fsspec.filesystem("file")
    with pytest.raises(GatewayError):
        own.check_file(fs, str(store / "uploads" / "theirs" / "x.jpg"), "input file")
    # What the kubernetes executor hands its pods reads back the same.
    again = Guard.of(own.urls(), fences=own.fence_urls())
    assert again.allows(place(str(store / "uploads" / "mine" / "x.jpg")))
    assert not again.allows(place(str(store / "uploads" / "theirs" / "x.jpg")))
