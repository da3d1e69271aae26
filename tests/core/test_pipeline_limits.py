"""The pipeline in-process: request defaults and checked options, a deadline already spent, the
concurrency limit that refuses instead of queueing, where JPEGs are decoded (the event loop or
the decode threads), trace headers to TF Serving and the log line, and an unexpected exception
answered INTERNAL with the request id.
"""

from __future__ import annotations

import asyncio
import io
import math
import threading
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from gateway.core import inputs
from gateway.core import pipeline as pipeline_module
from gateway.domain import ModelRef, Outcome, Request
from gateway.errors import GatewayError, Kind
from gateway.tasks.classification.nouns import ClassifyOptions
from gateway.tasks.detection import DetectionTask
from gateway.tasks.detection.nouns import DetectOptions
from tests.support.fakeserving import FakeModel
from tests.support.pipelines import (
    CLASSIFIER_CONFIG,
    OD_OUTPUTS,
    classifier_models,
    classify,
    detect,
    od_outputs,
    pipeline_for,
    png,
    run,
    solid,
    write_config,
)


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
