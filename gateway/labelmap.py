"""Label maps in the TF Object Detection API text format (`label_map.pbtxt`).

    item { id: 1 name: 'red_box' display_name: 'red box' }

Rules follow object_detection/utils/label_map_util.py: ids must be >= 0, id 0 is reserved for
the background, the first item wins for a duplicate id, and the display name is preferred.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf import text_format

from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs


class LabelMapError(ValueError):
    """A label map file that cannot be read or breaks the OD API rules."""


@dataclass(frozen=True)
class LabelMap:
    """Class id -> display name. Unknown ids are named `class_<id>`."""

    names: Mapping[int, str] = field(default_factory=dict)

    def label(self, class_id: int) -> str:
        return self.names.get(class_id) or f"class_{class_id}"

    @classmethod
    def parse(cls, text: str, source: str = "<label map>") -> LabelMap:
        message = tfs.StringIntLabelMap()
        try:
            text_format.Parse(text, message, allow_unknown_field=True)
        except text_format.ParseError as e:
            raise LabelMapError(f"{source}: not an OD API label map: {e}") from None
        names: dict[int, str] = {}
        for item in message.item:
            if item.id < 0:
                raise LabelMapError(f"{source}: label map ids must be >= 0, got {item.id}")
            if item.id == 0:
                continue  # reserved for the background class
            names.setdefault(item.id, item.display_name or item.name)
        return cls(names)

    @classmethod
    def load(cls, path: Path) -> LabelMap:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise LabelMapError(f"cannot read label map {path}: {e.strerror}") from None
        return cls.parse(text, str(path))
