"""Classifier outputs -> ranked classes: the three output forms and the refusals."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.config import Settings
from gateway.domain import Frame, OutputError
from gateway.errors import GatewayError, Kind
from gateway.labels import Labels
from gateway.models import ModelConfig
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.tasks.classification import ClassificationSettings, ClassificationTask
from gateway.tasks.classification.config import ClassificationConfig
from gateway.tasks.classification.nouns import ClassifyOptions
from gateway.upstream.signatures import Signature, TensorSpec

TASK = ClassificationTask()
LABELS = Labels.parse_lines("red\ngreen\nblue\n")
CONFIG = ModelConfig("m", "classification", LABELS)
FRAME = Frame(10, 10)


def signature(**outputs: TensorSpec) -> Signature:
    return Signature("m", 3, {"x": TensorSpec(tfs.DT_FLOAT, (-1, 224, 224, 3))}, outputs)


def ranked(outputs, top_k=3, min_score=0.0, form=None):
    specs = {
        k: TensorSpec(
            tfs.DT_STRING if v.dtype == object else tfs.DT_FLOAT,
            (-1, v.shape[-1]) if v.ndim == 2 else (-1,),
        )
        for k, v in outputs.items()
    }
    plan = TASK.output_plan(signature(**specs), CONFIG)
    if form:
        assert plan.form == form
    result = TASK.map(outputs, plan, FRAME, ClassificationSettings(top_k, min_score), CONFIG)
    return [(c.class_id, c.label, round(c.score, 4)) for c in result.classes]


def test_probabilities_are_sorted_cut_to_top_k_and_filtered():
    outputs = {"probabilities": np.array([[0.2, 0.3, 0.5]], np.float32)}
    assert ranked(outputs, form="probabilities") == [
        (2, "blue", 0.5),
        (1, "green", 0.3),
        (0, "red", 0.2),
    ]
    assert ranked(outputs, top_k=1) == [(2, "blue", 0.5)]
    assert ranked(outputs, min_score=0.25) == [(2, "blue", 0.5), (1, "green", 0.3)]


def test_scores_is_another_name_for_probabilities_and_ties_keep_class_order():
    outputs = {"scores": np.array([[0.25, 0.5, 0.25]], np.float32)}
    assert ranked(outputs) == [(1, "green", 0.5), (0, "red", 0.25), (2, "blue", 0.25)]


def test_logits_go_through_a_stable_softmax():
    logits = np.log(np.array([[0.1, 0.6, 0.3]])) + 1000.0  # large values must not overflow
    assert ranked({"logits": logits.astype(np.float32)}, form="logits") == [
        (1, "green", 0.6),
        (2, "blue", 0.3),
        (0, "red", 0.1),
    ]


def test_a_label_outside_the_labels_has_class_id_minus_one():
    outputs = {
        "label": np.array([b"purple"], object),
        "confidence": np.array([0.8], np.float32),
    }
    assert ranked(outputs, form="label") == [(-1, "purple", 0.8)]
    outputs["label"] = np.array([b"green"], object)
    assert ranked(outputs) == [(1, "green", 0.8)]
    assert ranked(outputs, min_score=0.9) == []


@pytest.mark.parametrize(
    ("outputs", "message"),
    [
        ({"probabilities": np.array([[0.2, np.nan, 0.5]], np.float32)}, "probabilities[1] is nan"),
        ({"probabilities": np.array([[2.0, -1.0, 0.0]], np.float32)}, "probabilities[0] is 2.0"),
        ({"probabilities": np.array([[0.2, 0.2]], np.float32)}, "sums to 0.4000"),
        (
            {"probabilities": np.array([[0.5, 0.25, 0.125, 0.125]], np.float32)},
            "4 classes but the model's labels name 3",
        ),
        ({"logits": np.array([[1.0, np.inf, 0.0]], np.float32)}, "NaN or infinite"),
        ({"probabilities": np.array([0.2, 0.3, 0.5], np.float32)}, "expected [1, classes]"),
    ],
)
def test_unusable_outputs_say_what_is_wrong(outputs, message):
    key = next(iter(outputs))
    plan = TASK.output_plan(signature(**{key: TensorSpec(tfs.DT_FLOAT, None)}), CONFIG)
    with pytest.raises(OutputError) as info:
        TASK.map(outputs, plan, FRAME, ClassificationSettings(3, 0.0), CONFIG)
    assert message in str(info.value)


def test_a_signature_without_classifier_outputs_is_a_bad_model_naming_the_keys():
    spec = TensorSpec(tfs.DT_FLOAT, (-1, 128))
    with pytest.raises(GatewayError) as info:
        TASK.output_plan(signature(embedding=spec, pooled=spec), CONFIG)
    assert info.value.kind is Kind.BAD_MODEL
    assert "outputs {embedding: DT_FLOAT [-1,128], pooled: DT_FLOAT [-1,128]}" in (
        info.value.message
    )
    assert "outputs.probabilities = '<output>', outputs.logits = '<output>'" in (info.value.message)


def test_options_take_the_model_default_and_refuse_out_of_range_values():
    own = ClassificationConfig(top_k=2, min_score=0.1)
    config = ModelConfig("m", "classification", LABELS, task_config=own)
    rules = config.rules(Settings())
    resolved = TASK.resolve(ClassifyOptions(), config, rules)
    assert (resolved.top_k, resolved.min_score) == (2, 0.1)
    assert TASK.resolve(ClassifyOptions(top_k=7), config, rules).top_k == 7
    unlisted = ModelConfig("m", "classification")
    assert TASK.resolve(ClassifyOptions(), unlisted, unlisted.rules(Settings())).top_k == 5
    with pytest.raises(GatewayError, match="top_k must be in"):
        TASK.resolve(ClassifyOptions(top_k=5000), config, rules)
    with pytest.raises(GatewayError, match="min_score must be in"):
        TASK.resolve(ClassifyOptions(min_score=-0.5), config, rules)
