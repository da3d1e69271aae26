"""The classification task's nouns: the options a caller gives (ClassifyOptions) and the
result it gets (Classes of ScoredClass); the binding converts them to and from
classification.v1 messages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, NamedTuple


class ClassifyOptions(NamedTuple):
    """Classification options as the caller gave them; 0 means the model's default."""

    top_k: Annotated[int, "classes returned (0: the model's default)"] = 0
    min_score: Annotated[float, "minimum score, 0..1 (0: the model's default)"] = 0.0


class ScoredClass(NamedTuple):
    class_id: int  # index in the model's labels; -1 for a label the model named that is not
    label: str
    score: float


@dataclass(frozen=True)
class Classes:
    classes: list[ScoredClass]
