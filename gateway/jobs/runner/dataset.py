"""The types a dataset is read into (runner.sources lists it, runner.manifest
and the TFRecord reader make its items), and the image reads they share: never more than
the image limit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import GatewayError, Kind
from gateway.jobs.runner import storage
from gateway.jobs.runner.access import Guard
from gateway.jobs.runner.dataset_limits import Limits
from gateway.jobs.runner.storage import Location, TooLarge


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
    limits: Limits = field(default_factory=Limits)

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
    held: int = 0  # image bytes the runner counts as held for it (gateway.jobs.runner.shard)


def invalid(message: str) -> GatewayError:
    return GatewayError(Kind.INVALID_INPUT, message)


def check_size(dataset: Dataset, f: InputFile) -> None:
    """A manifest or TFRecord file listed larger than a file may inflate to is refused
    before it is opened."""
    if f.size > dataset.limits.max_decompressed_bytes:
        raise dataset.limits.inflates_too_much(dataset.location.url(f.path))


def loader(
    dataset: Dataset, guard: Guard | None, fs: Any, path: str, what: str, size: int | None = None
) -> Callable[[], bytes]:
    """Reads an image: at most the image limit (its listed size checked first, then a ranged
    read), GatewayError TOO_LARGE past it; with a guard, checked again just before."""
    limits = dataset.limits

    def read(fs: Any, path: str) -> bytes:
        try:
            return storage.read_capped(fs, path, limits.max_image_bytes, size)
        except TooLarge as e:
            shown = f"{what} {Location(fs, path).url()}"
            raise limits.image_too_large(e.size, shown) from None

    def load() -> bytes:
        if guard is not None:  # again just before: a symlink may have changed
            guard.check_file(fs, path, what)
        return read(fs, path)

    return load
