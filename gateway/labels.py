"""Class names of a model: OD API label maps (`label_map.pbtxt`) and `labels.txt` files.

    item { id: 1 name: 'red_box' display_name: 'red box' }

Label map rules follow object_detection/utils/label_map_util.py: ids must be >= 0, id 0 is
reserved for the background, the first item wins for a duplicate id, and the display name is
preferred. A `labels.txt` (as classifiers ship) has one label per line; line k is class id k.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from google.protobuf import text_format

from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs


class LabelsError(ValueError):
    """A label file that cannot be read or breaks its format's rules."""


@dataclass(frozen=True)
class Labels:
    """Class id <-> name; ids without a name are called `class_<id>`."""

    names: Mapping[int, str] = field(default_factory=dict)

    def label(self, class_id: int) -> str:
        return self.names.get(class_id) or f"class_{class_id}"

    def index(self, name: str) -> int:
        """The id of a label (the lowest, if several share it), or -1."""
        return self._ids.get(name, -1)

    @cached_property
    def _ids(self) -> dict[str, int]:
        ids: dict[str, int] = {}
        for class_id in sorted(self.names):
            ids.setdefault(self.names[class_id], class_id)
        return ids

    @classmethod
    def parse_label_map(cls, text: str, source: str = "<label map>") -> Labels:
        message = tfs.StringIntLabelMap()
        try:
            text_format.Parse(text, message, allow_unknown_field=True)
        except text_format.ParseError as exc:
            raise LabelsError(f"{source}: not an OD API label map: {exc}") from None
        names: dict[int, str] = {}
        for item in message.item:
            if item.id < 0:
                raise LabelsError(f"{source}: label map ids must be >= 0, got {item.id}")
            if item.id == 0:
                continue  # reserved for the background class
            names.setdefault(item.id, item.display_name or item.name)
        return cls(names)

    @classmethod
    def parse_lines(cls, text: str, source: str = "<labels>") -> Labels:
        lines = [line.strip() for line in text.splitlines()]
        while lines and not lines[-1]:
            lines.pop()
        if not lines:
            raise LabelsError(f"{source}: no labels (expected one label per line)")
        if "" in lines:
            raise LabelsError(
                f"{source}: line {lines.index('') + 1} is empty; every class needs a label"
            )
        return cls(dict(enumerate(lines)))

    @classmethod
    def load_label_map(cls, path: Path) -> Labels:
        return cls.parse_label_map(_read(path, "label map"), str(path))

    @classmethod
    def load_lines(cls, path: Path) -> Labels:
        return cls.parse_lines(_read(path, "labels"), str(path))


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise LabelsError(f"cannot read {what} {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise LabelsError(f"{what} {path} is not UTF-8 text") from None
