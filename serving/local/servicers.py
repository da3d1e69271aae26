"""gRPC servicers on the official tensorflow_serving.apis base classes.

Thin adapters over `core.ServingCore`; `_status_of` is the one place where failures become
gRPC statuses (TF Serving's ToGRPCStatus: same code, message cut to 1024 characters).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NoReturn, TypeVar

import grpc
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from serving.local.core import ServingCore
from serving.local.errors import ServingError, from_exception, truncate

log = logging.getLogger(__name__)

R = TypeVar("R")
# Remaining times at least this long mean the client set no deadline (about 24 days).
_NO_DEADLINE_MS = 2**31 - 1

# What the local server leaves out of TF Serving's API, and why.
_UNIMPLEMENTED = {
    "Classify": "Classify is not implemented by the local server; use Predict",
    "Regress": "Regress is not implemented by the local server; use Predict",
    "MultiInference": "MultiInference is not implemented by the local server; use Predict",
    "HandleReloadConfigRequest": (
        "HandleReloadConfigRequest is not implemented by the local server; edit "
        "--model_config_file and set --model_config_file_poll_wait_seconds"
    ),
}


def _status_of(context: grpc.ServicerContext, call: Callable[[], R]) -> R:
    """Runs an RPC body; any failure aborts the RPC with TF Serving's code and message."""
    try:
        return call()
    except ServingError as exc:
        error = exc
    except Exception as exc:
        log.exception("Unexpected error while serving a request")
        error = from_exception(exc)
    context.abort(error.code, truncate(error.message))
    raise error  # unreachable: abort() raises to end the RPC


def _unimplemented(context: grpc.ServicerContext, method: str) -> NoReturn:
    context.abort(grpc.StatusCode.UNIMPLEMENTED, _UNIMPLEMENTED[method])
    raise AssertionError("unreachable: abort() raises to end the RPC")


def _timeout_ms(context: grpc.ServicerContext) -> int | None:
    """The client's deadline as RunOptions.timeout_in_ms (DeadlineToTimeoutMillis).

    At least 1 ms: TensorFlow reads 0 or less as "no timeout".
    """
    remaining = context.time_remaining()
    if remaining is None or remaining * 1000 >= _NO_DEADLINE_MS:
        return None  # gRPC reports "no deadline" as a huge remaining time
    return max(1, int(remaining * 1000))


class PredictionServicer(prediction_service_pb2_grpc.PredictionServiceServicer):
    """tensorflow.serving.PredictionService."""

    def __init__(self, core: ServingCore) -> None:
        self._core = core

    def Predict(
        self, request: predict_pb2.PredictRequest, context: grpc.ServicerContext
    ) -> predict_pb2.PredictResponse:
        return _status_of(context, lambda: self._core.predict(request, _timeout_ms(context)))

    def GetModelMetadata(
        self,
        request: get_model_metadata_pb2.GetModelMetadataRequest,
        context: grpc.ServicerContext,
    ) -> get_model_metadata_pb2.GetModelMetadataResponse:
        return _status_of(context, lambda: self._core.get_model_metadata(request))

    def Classify(self, request: object, context: grpc.ServicerContext) -> NoReturn:
        _unimplemented(context, "Classify")

    def Regress(self, request: object, context: grpc.ServicerContext) -> NoReturn:
        _unimplemented(context, "Regress")

    def MultiInference(self, request: object, context: grpc.ServicerContext) -> NoReturn:
        _unimplemented(context, "MultiInference")


class ModelServicer(model_service_pb2_grpc.ModelServiceServicer):
    """tensorflow.serving.ModelService."""

    def __init__(self, core: ServingCore) -> None:
        self._core = core

    def GetModelStatus(
        self,
        request: get_model_status_pb2.GetModelStatusRequest,
        context: grpc.ServicerContext,
    ) -> get_model_status_pb2.GetModelStatusResponse:
        return _status_of(context, lambda: self._core.get_model_status(request))

    def HandleReloadConfigRequest(self, request: object, context: grpc.ServicerContext) -> NoReturn:
        _unimplemented(context, "HandleReloadConfigRequest")
