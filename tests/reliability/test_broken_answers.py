"""Broken TF Serving answers: the real model's response, damaged on the way by the fault
upstream, gives FAILED_PRECONDITION saying what was wrong, logged once per model version."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import pytest

from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.upstream.tensors import to_array
from tests.support.faultupstream import FaultyUpstream
from tests.support.gatewayproc import run_gateway
from tests.support.localserver import LocalServer

Mutation = Callable[[tfs.PredictResponse], None]


def _edit(key: str, change: Callable[[np.ndarray], np.ndarray]) -> Mutation:
    """Rewrites one output as float32 tensor_content after `change`."""

    def mutate(response: tfs.PredictResponse) -> None:
        array = np.ascontiguousarray(change(to_array(response.outputs[key]).copy()), np.float32)
        tensor = response.outputs[key]
        tensor.Clear()
        tensor.dtype = tfs.DT_FLOAT
        tensor.tensor_shape.dim.extend(tfs.TensorShapeProto.Dim(size=n) for n in array.shape)
        tensor.tensor_content = array.tobytes()

    return mutate


def _set(index: tuple[int, ...], value: float) -> Callable[[np.ndarray], np.ndarray]:
    def change(array: np.ndarray) -> np.ndarray:
        array[index] = value
        return array

    return change


def _drop(key: str) -> Mutation:
    def mutate(response: tfs.PredictResponse) -> None:
        del response.outputs[key]

    return mutate


def _as_strings(key: str) -> Mutation:
    def mutate(response: tfs.PredictResponse) -> None:
        response.outputs[key].CopyFrom(
            tfs.TensorProto(
                dtype=tfs.DT_STRING,
                tensor_shape=tfs.TensorShapeProto(dim=[tfs.TensorShapeProto.Dim(size=1)]),
                string_val=[b"x"],
            )
        )

    return mutate


def _truncate_content(key: str) -> Mutation:
    def mutate(response: tfs.PredictResponse) -> None:
        _edit(key, lambda a: a)(response)
        response.outputs[key].tensor_content = response.outputs[key].tensor_content[:-4]

    return mutate


CASES: dict[str, tuple[Mutation, str]] = {
    "missing output": (_drop("detection_scores"), "lacks outputs ['detection_scores']"),
    "wrong shape": (
        _edit("detection_boxes", lambda a: a.reshape(1, -1, 2)),
        "detection_boxes has shape [1, 200, 2]; expected [1, N, 4]",
    ),
    "mismatched lengths": (
        _edit("detection_scores", lambda a: a[:, :50]),
        "do not match detection_boxes",
    ),
    "string dtype": (
        _as_strings("detection_classes"),
        "detection_classes has dtype string; expected numbers",
    ),
    "short tensor_content": (_truncate_content("detection_boxes"), "tensor_content has"),
    "NaN score": (
        _edit("detection_scores", _set((0, 0), float("nan"))),
        "detection_scores[0] is nan",
    ),
    "score above 1": (
        _edit("detection_scores", _set((0, 1), 7.5)),
        "detection_scores[1] is 7.5; scores must be numbers in [0, 1]",
    ),
    "pixel boxes": (
        _edit("detection_boxes", lambda a: a * 640),
        "outside [0, 1]: the gateway needs normalized",
    ),
    "infinite box": (
        _edit("detection_boxes", _set((0, 0, 2), float("inf"))),
        "detection_boxes[0] is [",
    ),
    "negative class": (
        _edit("detection_classes", _set((0, 0), -3)),
        "detection_classes[0] is -3.0",
    ),
    "num_detections beyond the arrays": (
        _edit("num_detections", lambda a: a * 0 + 1000),
        "num_detections is 1000 but the outputs hold only 100 detections",
    ),
    "num_detections NaN": (
        _edit("num_detections", lambda a: a * np.nan),
        "num_detections is nan",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_broken_answer_is_failed_precondition_logged_once_per_version(
    case: str, tfs: LocalServer, tmp_path: Path, request_small: pb.DetectRequest
) -> None:
    mutation, text = CASES[case]
    with FaultyUpstream(tfs.target) as upstream:
        upstream.mutate = mutation
        with run_gateway(upstream.target, log_dir=tmp_path) as gw, gw.channel() as channel:
            stub = gw.stub(channel)
            errors = []
            for _ in range(3):
                with pytest.raises(grpc.RpcError) as info:
                    stub.Detect(request_small, timeout=60)
                errors.append(info.value)
            upstream.mutate = None  # the gateway serves on once the answers are right again
            result = stub.Detect(request_small, timeout=60)
            records = gw.records()
    for error in errors:
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "model 'detector' version 1" in error.details()
        assert text in error.details(), error.details()
    assert len(result.detections) == 2
    warnings = [r for r in records if r.get("logger") == "gateway.tasks"]
    assert len(warnings) == 1
    assert warnings[0]["level"] == "WARNING"
    assert (warnings[0]["model"], warnings[0]["version"]) == ("detector", 1)
    assert text in warnings[0]["problem"]
