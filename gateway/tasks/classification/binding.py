"""classification.v1 (ClassificationService: Classify, ClassifyStream) <-> the classification
task's plain types."""

from __future__ import annotations

from gateway.api.bindings import Binding
from gateway.proto.classification.v1 import classification_pb2 as cpb
from gateway.tasks.classification.nouns import Classes, ClassifyOptions


def fill_classes(result: cpb.ClassificationResult, found: Classes) -> None:
    add = result.classes.add
    for scored in found.classes:
        add(class_id=scored.class_id, label=scored.label, score=scored.score)


BINDING = Binding.of(cpb.DESCRIPTOR, ClassifyOptions, fill_classes, summary="Classify")
