"""The pipeline in-process against a TF Serving built from the official protos (fakeserving):
input forms, tasks, defaults, errors, deadline, concurrency limit and trace propagation."""

from __future__ import annotations

import asyncio
import base64
import io
import math
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from gateway.app import built_in_tasks
from gateway.config import Settings
from gateway.core import inputs
from gateway.core import pipeline as pipeline_module
from gateway.core.domain import Outcome, Request
from gateway.core.pipeline import Pipeline
from gateway.errors import GatewayError, Kind
from gateway.modelref import ModelRef
from gateway.models import ModelRegistry, default_registry, load_registry
from gateway.tasks.detection import DetectionTask
from gateway.tasks.types import ClassifyOptions, DetectOptions
from gateway.upstream.client import TFServingClient
from tests.support.fakeserving import FakeModel, FakeServing

LABELS = ["red", "green", "blue", "yellow", "cyan", "magenta", "white", "black"]


def png(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def solid(width: int, height: int, rgb: tuple[int, int, int]) -> np.ndarray:
    return np.broadcast_to(np.array(rgb, np.uint8), (height, width, 3)).copy()


def probabilities(values: list[float]) -> Callable[[Any], dict[str, np.ndarray]]:
    return lambda inputs: {"probabilities": np.array([values], np.float32)}


def od_outputs(inputs: Any) -> dict[str, np.ndarray]:
    """One box at the centre half of the image, class 1, score 0.9."""
    boxes = np.zeros((1, 4, 4), np.float32)
    boxes[0, 0] = [0.25, 0.25, 0.75, 0.75]
    scores = np.array([[0.9, 0, 0, 0]], np.float32)
    return {
        "detection_boxes": boxes,
        "detection_scores": scores,
        "detection_classes": np.array([[1, 0, 0, 0]], np.float32),
        "num_detections": np.array([1], np.float32),
    }


OD_OUTPUTS = {
    "detection_boxes": (tf.float32, [1, -1, 4]),
    "detection_scores": (tf.float32, [1, -1]),
    "detection_classes": (tf.float32, [1, -1]),
    "num_detections": (tf.float32, [1]),
}


def write_config(tmp: Path, text: str) -> Path:
    (tmp / "labels.txt").write_text("\n".join(LABELS) + "\n")
    (tmp / "label_map.pbtxt").write_text("item { id: 1 name: 'red_box' }\n")
    path = tmp / "models.toml"
    path.write_text(text)
    return path


@asynccontextmanager
async def pipeline_for(
    models: list[FakeModel], config: Path | None = None, **settings: Any
) -> AsyncIterator[tuple[Pipeline, FakeServing]]:
    serving = FakeServing({m.name: m for m in models})
    target = await serving.start()
    s = Settings(upstream=target, upstream_retry_backoff=0.001, **settings)
    tasks = built_in_tasks()
    registry: ModelRegistry = (
        load_registry(config, s.model, tasks=tasks.names)
        if config is not None
        else default_registry(s.model)
    )
    client = TFServingClient(s)
    with ThreadPoolExecutor(2) as executor:
        try:
            yield Pipeline(s, client, registry, executor, tasks), serving
        finally:
            await client.close()
            await serving.stop()


def classify(image: bytes, model: str = "", **options: Any) -> Request:
    return Request(image, ModelRef(model), ClassifyOptions(**options), method="test")


def detect(image: bytes, model: str = "", **options: Any) -> Request:
    return Request(image, ModelRef(model), DetectOptions(**options), method="test")


def run(coro: Any) -> Any:
    return asyncio.run(coro)


CLASSIFIER_CONFIG = """
[defaults]
classification = "scores"

[models.scores]
task = "classification"
labels = "labels.txt"
top_k = 3
[models.scores.input]
scale = 0.00392156862745098

[models.logits]
task = "classification"
labels = "labels.txt"
[models.logits.input]
scale = 0.00392156862745098
mean = [0.5, 0.5, 0.5]
std = [0.5, 0.5, 0.5]
layout = "NCHW"

[models.vit]
task = "classification"
labels = "labels.txt"
[models.vit.input]
string_encoding = "base64url"

[models.fixed]
task = "detection"
label_map = "label_map.pbtxt"
"""


def classifier_models() -> list[FakeModel]:
    probs = [0.05, 0.1, 0.6, 0.2, 0.05, 0.0, 0.0, 0.0]
    return [
        FakeModel(
            "scores",
            {"input_tensor": (tf.float32, [-1, 224, 224, 3])},
            {"probabilities": (tf.float32, [-1, 8])},
            probabilities(probs),
        ),
        FakeModel(
            "logits",
            {"pixel_values": (tf.float32, [-1, 3, 224, 224])},
            {"logits": (tf.float32, [-1, 8])},
            lambda inputs: {"logits": np.log(np.array([probs], np.float32) + 1e-9)},
        ),
        FakeModel(
            "vit",
            {"string_input": (tf.string, [-1])},
            {"label": (tf.string, [-1]), "confidence": (tf.float32, [-1])},
            lambda inputs: {
                "label": np.array([b"blue"], object),
                "confidence": np.array([0.75], np.float32),
            },
        ),
        FakeModel(
            "fixed",
            {"input_tensor": (tf.uint8, [1, 320, 320, 3])},
            OD_OUTPUTS,
            od_outputs,
        ),
    ]


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


def test_request_defaults_options_and_model_names_are_checked(tmp_path):
    config = write_config(tmp_path, CLASSIFIER_CONFIG)
    image = png(solid(8, 8, (0, 0, 255)))

    async def scenario() -> list[GatewayError]:
        found = []
        # The default model is a classifier and the file names no detection default.
        async with pipeline_for(classifier_models(), config, model="scores") as (pipeline, _):
            for task, request in (
                ("classification", classify(image, top_k=-1)),
                ("classification", classify(image, min_score=math.nan)),
                ("detection", detect(image)),
                ("classification", classify(image, "missing")),
                (
                    "classification",
                    Request(image, ModelRef("scores", version=0), ClassifyOptions()),
                ),
            ):
                with pytest.raises(GatewayError) as info:
                    await pipeline.run(task, request)
                found.append(info.value)
        return found

    top_k, nan, no_default, missing, version = run(scenario())
    assert top_k.kind is Kind.INVALID_INPUT and "top_k must be in [0, 1000]" in top_k.message
    assert nan.kind is Kind.INVALID_INPUT and "min_score must be in [0, 1]" in nan.message
    assert no_default.kind is Kind.INVALID_INPUT
    assert "no default detection model" in no_default.message
    assert missing.kind is Kind.NOT_FOUND and "model 'missing'" in missing.message
    assert version.kind is Kind.INVALID_INPUT and "positive version" in version.message


def test_a_deadline_already_spent_fails_before_tf_serving_is_called():
    model = classifier_models()[3]

    async def scenario() -> tuple[GatewayError, int]:
        async with pipeline_for([model], model="fixed") as (pipeline, serving):
            request = Request(png(solid(8, 8, (0, 0, 0))), ModelRef(""), DetectOptions(), timeout=0)
            with pytest.raises(GatewayError) as info:
                await pipeline.run("detection", request)
            return info.value, len(serving.calls)

    error, calls = run(scenario())
    assert error.kind is Kind.DEADLINE and calls == 0


def test_the_concurrency_limit_refuses_instead_of_queueing():
    model = classifier_models()[3]

    async def scenario() -> list[object]:
        async with pipeline_for([model], model="fixed", max_concurrent_requests=1) as (
            pipeline,
            _,
        ):
            image = png(solid(2000, 2000, (9, 9, 9)))
            results = await asyncio.gather(
                *(pipeline.run("detection", detect(image)) for _ in range(3)),
                return_exceptions=True,
            )
            return results

    results = run(scenario())
    refused = [r for r in results if isinstance(r, GatewayError)]
    assert len(refused) == 2 and all(r.kind is Kind.OVERLOADED for r in refused)
    assert "limit of 1 images" in refused[0].message


def jpeg(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


def test_a_small_jpeg_alone_is_decoded_on_the_event_loop_and_the_rest_in_decode_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pixels_model = FakeModel(
        "pixels", {"input_tensor": (tf.uint8, [1, -1, -1, 3])}, OD_OUTPUTS, od_outputs
    )
    built_in: list[bool] = []  # per request built: on the event loop's thread?

    def recording(*args: Any) -> Any:
        built_in.append(threading.current_thread() is threading.main_thread())
        return inputs.build_input(*args)

    monkeypatch.setattr(pipeline_module, "build_input", recording)
    small = jpeg(solid(64, 48, (200, 10, 10)))

    async def scenario() -> list[Outcome]:
        async with pipeline_for([pixels_model], model="pixels") as (pipeline, serving):
            outcomes = [await pipeline.run("detection", detect(small))]
            # Over INLINE_MAX_PIXELS; not a JPEG; two at once (the second sees one in flight).
            outcomes.append(
                await pipeline.run("detection", detect(jpeg(solid(1000, 600, (9,) * 3))))
            )
            outcomes.append(await pipeline.run("detection", detect(png(solid(64, 48, (9,) * 3)))))
            outcomes += await asyncio.gather(
                pipeline.run("detection", detect(small)), pipeline.run("detection", detect(small))
            )
            assert [call.inputs["input_tensor"].shape for call in serving.calls] == [
                (1, 48, 64, 3), (1, 600, 1000, 3), (1, 48, 64, 3), (1, 48, 64, 3), (1, 48, 64, 3)
            ]  # fmt: skip
            return outcomes

    outcomes = run(scenario())
    assert built_in == [True, False, False, True, False]
    assert all(o.result.detections[0].box == (16, 12, 48, 36) for o in (outcomes[0], *outcomes[3:]))


def test_trace_headers_reach_tf_serving_and_the_log_line(caplog):
    model = classifier_models()[3]
    trace = (
        ("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        ("x-b3-traceid", "4bf92f3577b34da6a3ce929d0e0e4736"),
        ("x-request-id", "r-1"),
    )

    async def scenario() -> tuple[dict[str, str], list[dict[str, str]]]:
        async with pipeline_for([model], model="fixed") as (pipeline, serving):
            request = Request(
                png(solid(8, 8, (0, 0, 0))), ModelRef(""), DetectOptions(), "r-1", trace=trace
            )
            await pipeline.run("detection", request)
            return serving.calls[-1].metadata, serving.metadata_calls

    caplog.set_level("INFO", logger="gateway.request")
    metadata, metadata_calls = run(scenario())
    # The first request also fetched the model's signature, with the same headers.
    assert len(metadata_calls) == 1
    for key, value in trace:
        assert metadata[key] == value
        assert metadata_calls[0][key] == value
    [record] = [r for r in caplog.records if r.name == "gateway.request"]
    assert record.fields["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"  # type: ignore[attr-defined]
    assert record.fields["request_id"] == "r-1"  # type: ignore[attr-defined]


def test_an_unexpected_exception_is_internal_quoting_the_request_id(caplog, monkeypatch):
    # Fault injection: the detection task's mapping raises what no check anticipated.
    model = classifier_models()[3]

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("a bug in the mapping")

    monkeypatch.setattr(DetectionTask, "map", broken)

    async def scenario() -> GatewayError:
        async with pipeline_for([model], model="fixed") as (pipeline, _):
            request = Request(png(solid(8, 8, (0, 0, 0))), ModelRef(""), DetectOptions(), "r-int")
            with pytest.raises(GatewayError) as info:
                await pipeline.run("detection", request)
            return info.value

    caplog.set_level("INFO")
    error = run(scenario())
    assert error.kind is Kind.INTERNAL
    assert error.message == "internal error in the gateway; quote request id r-int"
    [logged] = [r for r in caplog.records if r.getMessage() == "unexpected error"]
    assert logged.exc_info is not None and "a bug in the mapping" in str(logged.exc_info[1])
    [line] = [r for r in caplog.records if r.name == "gateway.request"]
    assert line.fields["code"] == "INTERNAL"  # type: ignore[attr-defined]
