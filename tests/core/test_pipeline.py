"""The pipeline in-process against a TF Serving built from the official protos (fakeserving):
each task's input forms and outputs (probabilities, logits, label and confidence, a fixed-size
detector's boxes in the original's pixels) and the models it refuses.

Its limits and errors are in test_pipeline_limits.py.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from gateway.domain import Outcome
from gateway.errors import GatewayError, Kind
from tests.support.fakeserving import FakeModel
from tests.support.pipelines import (
    CLASSIFIER_CONFIG,
    classifier_models,
    classify,
    detect,
    pipeline_for,
    png,
    probabilities,
    run,
    solid,
    write_config,
)


def test_probabilities_are_ranked_with_labels_and_the_input_is_resized_and_rescaled(tmp_path):
    config = write_config(tmp_path, CLASSIFIER_CONFIG)

    async def scenario() -> tuple[Outcome, Any]:
        async with pipeline_for(classifier_models(), config) as (pipeline, serving):
            image = png(solid(640, 480, (255, 128, 0)))
            outcome = await pipeline.run("classification", classify(image))
            return outcome, serving.calls[-1]

    outcome, call = run(scenario())
    assert [(c.class_id, c.label) for c in outcome.result.classes] == [
        (2, "blue"),
        (3, "yellow"),
        (1, "green"),
    ]  # top_k = 3 from the model config
    assert outcome.result.classes[0].score == pytest.approx(0.6)
    assert (outcome.image_width, outcome.image_height, outcome.model_name) == (640, 480, "scores")
    sent = call.inputs["input_tensor"]
    assert sent.shape == (1, 224, 224, 3) and sent.dtype == np.float32
    np.testing.assert_allclose(sent[0, 100, 100], [1.0, 128 / 255, 0.0], atol=1e-6)
    assert call.output_filter == ["probabilities"]


def test_logits_go_through_softmax_and_pixels_are_normalised_nchw(tmp_path):
    config = write_config(tmp_path, CLASSIFIER_CONFIG)

    async def scenario() -> tuple[Outcome, Any]:
        async with pipeline_for(classifier_models(), config) as (pipeline, serving):
            image = png(solid(300, 200, (255, 0, 51)))
            outcome = await pipeline.run("classification", classify(image, "logits", top_k=8))
            return outcome, serving.calls[-1]

    outcome, call = run(scenario())
    scores = {c.label: c.score for c in outcome.result.classes}
    assert scores["blue"] == pytest.approx(0.6, abs=1e-5)
    assert sum(scores.values()) == pytest.approx(1.0, abs=1e-5)
    assert len(outcome.result.classes) == 8
    sent = call.inputs["pixel_values"]
    assert sent.shape == (1, 3, 224, 224)
    # (x/255 - 0.5) / 0.5 per channel: 255 -> 1, 0 -> -1, 51 -> -0.6
    np.testing.assert_allclose(sent[0, :, 7, 9], [1.0, -1.0, -0.6], atol=1e-5)


def test_label_and_confidence_with_base64url_strings(tmp_path):
    config = write_config(tmp_path, CLASSIFIER_CONFIG)
    image = png(solid(64, 64, (0, 0, 255)))

    async def scenario() -> tuple[Outcome, Any]:
        async with pipeline_for(classifier_models(), config) as (pipeline, serving):
            outcome = await pipeline.run("classification", classify(image, "vit"))
            return outcome, serving.calls[-1]

    outcome, call = run(scenario())
    [top] = outcome.result.classes
    assert (top.class_id, top.label, top.score) == (2, "blue", pytest.approx(0.75))
    (sent,) = call.inputs["string_input"]
    assert sent == base64.urlsafe_b64encode(image)
    assert sorted(call.output_filter) == ["confidence", "label"]


def test_a_fixed_size_detector_gets_its_size_and_boxes_come_back_in_original_pixels(tmp_path):
    config = write_config(tmp_path, CLASSIFIER_CONFIG)

    async def scenario() -> tuple[Outcome, Any]:
        async with pipeline_for(classifier_models(), config) as (pipeline, serving):
            image = png(solid(1000, 600, (200, 10, 10)))
            outcome = await pipeline.run("detection", detect(image, "fixed"))
            return outcome, serving.calls[-1]

    outcome, call = run(scenario())
    assert call.inputs["input_tensor"].shape == (1, 320, 320, 3)
    [d] = outcome.result.detections
    assert (d.box.x_min, d.box.y_min, d.box.x_max, d.box.y_max) == (250, 150, 750, 450)
    assert d.label == "red_box"


def test_a_model_configured_for_another_task_is_refused(tmp_path):
    config = write_config(tmp_path, CLASSIFIER_CONFIG)

    async def scenario() -> GatewayError:
        async with pipeline_for(classifier_models(), config) as (pipeline, _):
            with pytest.raises(GatewayError) as info:
                await pipeline.run("detection", detect(png(solid(8, 8, (0, 0, 0))), "scores"))
            return info.value

    error = run(scenario())
    assert error.kind is Kind.BAD_MODEL
    assert "configured as a classification model" in error.message


def test_a_signature_without_classifier_outputs_names_what_it_has():
    model = FakeModel(
        "odd",
        {"input_tensor": (tf.uint8, [1, -1, -1, 3])},
        {"embedding": (tf.float32, [-1, 128]), "pooled": (tf.float32, [-1, 128])},
        lambda inputs: {
            "embedding": np.zeros((1, 128), np.float32),
            "pooled": np.zeros((1, 128), np.float32),
        },
    )

    async def scenario() -> GatewayError:
        async with pipeline_for([model]) as (pipeline, _):
            with pytest.raises(GatewayError) as info:
                await pipeline.run("classification", classify(png(solid(8, 8, (1, 2, 3))), "odd"))
            return info.value

    error = run(scenario())
    assert error.kind is Kind.BAD_MODEL
    assert "embedding: DT_FLOAT [-1,128]" in error.message
    assert "outputs.probabilities = '<output>'" in error.message


def test_probabilities_that_do_not_sum_to_one_are_a_bad_model(tmp_path):
    model = FakeModel(
        "scores",
        {"input_tensor": (tf.float32, [-1, 224, 224, 3])},
        {"probabilities": (tf.float32, [-1, 8])},
        probabilities([0.9] * 8),
    )
    config = write_config(tmp_path, CLASSIFIER_CONFIG)

    async def scenario() -> GatewayError:
        async with pipeline_for([model], config) as (pipeline, _):
            with pytest.raises(GatewayError) as info:
                await pipeline.run("classification", classify(png(solid(8, 8, (0, 0, 0)))))
            return info.value

    error = run(scenario())
    assert error.kind is Kind.BAD_MODEL and "sums to 7.2000, not 1" in error.message
