"""GatewayClient: every task of the bindings by its verb on one channel, streams, the names of
the first release, and a clear error for a verb no binding has."""

from __future__ import annotations

import io

import grpc
import numpy as np
import pytest
from PIL import Image

from gateway.client import ClassificationClient, DetectionClient, GatewayClient
from tests.support.doors import InProcessDoors


def png(colour: tuple[int, int, int], size: int = 64) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((size, size, 3), colour, np.uint8)).save(out, "PNG")
    return out.getvalue()


def test_each_task_is_a_method_named_by_its_verb(doors: InProcessDoors) -> None:
    with GatewayClient(doors.grpc_target) as client:
        found = client.detect(png((90, 90, 90)), model="detector")
        assert [(d.label, d.box.x_min, d.box.x_max) for d in found.detections] == [
            ("a box", 16, 48)
        ]
        classes = client.classify(png((10, 10, 250)), model="colours", top_k=1)
        assert [c.label for c in classes.classes] == ["blue"]
        assert client.call("classify", png((250, 10, 10)), model="colours").classes[0].label == (
            "red"
        )


def test_streams_answer_in_order(doors: InProcessDoors) -> None:
    colours = [(250, 10, 10), (10, 250, 10), (10, 10, 250)]
    with GatewayClient(doors.grpc_target) as client:
        results = list(client.classify_stream((png(c) for c in colours), model="colours"))
    assert [r.classes[0].label for r in results] == ["red", "green", "blue"]


def test_the_first_releases_names_are_the_same_client(doors: InProcessDoors) -> None:
    assert DetectionClient is GatewayClient and ClassificationClient is GatewayClient
    with DetectionClient(doors.grpc_target) as client:
        assert len(client.detect(png((90, 90, 90)), model="detector").detections) == 1


def test_a_verb_no_binding_has_is_named_with_the_tasks_there_are(doors: InProcessDoors) -> None:
    with GatewayClient(doors.grpc_target) as client:
        with pytest.raises(AttributeError, match="the tasks are detect, classify"):
            client.transcribe(b"")
        with pytest.raises(grpc.RpcError) as failed:
            client.detect(b"not an image", model="detector")
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
