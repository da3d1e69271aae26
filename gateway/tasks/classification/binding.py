"""classification.v1 (ClassificationService: Classify, ClassifyStream) <-> the classification
task's plain types."""

from __future__ import annotations

from gateway.api.bindings import Binding
from gateway.proto.classification.v1 import classification_pb2 as cpb
from gateway.tasks.classification.nouns import Classes, ClassifyOptions

CLASSIFICATION = "classification"


def fill_classes(result: cpb.ClassificationResult, found: Classes) -> None:
    add = result.classes.add
    for scored in found.classes:
        add(class_id=scored.class_id, label=scored.label, score=scored.score)


BINDING = Binding.of(
    cpb.DESCRIPTOR.services_by_name["ClassificationService"],
    task=CLASSIFICATION,
    verb="classify",
    options_type=ClassifyOptions,
    fill_result=fill_classes,
    summary="Classify",
    options={
        "top_k": "classes returned (0: the model's default)",
        "min_score": "minimum score, 0..1 (0: the model's default)",
    },
    package=__package__,
)
