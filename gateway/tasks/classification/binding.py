"""classification.v1 (ClassificationService: Classify, ClassifyStream) <-> the classification
task's plain types."""

from __future__ import annotations

from gateway.api.bindings import Binding, page_script, served_model
from gateway.domain import Outcome
from gateway.proto.classification.v1 import classification_pb2 as cpb
from gateway.tasks.classification import drawing
from gateway.tasks.classification.nouns import Classes, ClassifyOptions

CLASSIFICATION = "classification"


def to_classification_result(outcome: Outcome) -> cpb.ClassificationResult:
    assert isinstance(outcome.result, Classes)
    return cpb.ClassificationResult(
        classes=[
            cpb.ScoredClass(class_id=scored.class_id, label=scored.label, score=scored.score)
            for scored in outcome.result.classes
        ],
        image_width=outcome.image_width,
        image_height=outcome.image_height,
        model=served_model(outcome),
        request_id=outcome.request_id,
    )


BINDING = Binding(
    task=CLASSIFICATION,
    verb="classify",
    service=cpb.DESCRIPTOR.services_by_name["ClassificationService"],
    unary="Classify",
    stream="ClassifyStream",
    request_type=cpb.ClassifyRequest,
    result_type=cpb.ClassificationResult,
    options_type=ClassifyOptions,
    to_result=to_classification_result,
    summary="Classify",
    options={
        "top_k": "classes returned (0: the model's default)",
        "min_score": "minimum score, 0..1 (0: the model's default)",
    },
    page=page_script(__file__),
    draw=drawing.draw,
)
