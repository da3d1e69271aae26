"""Model warmup at load: replay `assets.extra/tf_serving_warmup_requests` like TF Serving.

The file is a TFRecord of serialized PredictionLog. Rules and texts are those of
saved_model_warmup_util.cc / saved_model_warmup.cc: a missing file is fine, at most 1000
records, unparsable records and unsupported log types fail the load of that version.
"""

from __future__ import annotations

import logging
import os
import time

import grpc
import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2

from serving.local.errors import ServingError, invalid_argument
from serving.local.predict import run_predict
from serving.local.servable import Servable

log = logging.getLogger(__name__)

ASSETS_EXTRA = "assets.extra"
WARMUP_FILENAME = "tf_serving_warmup_requests"
MAX_RECORDS = 1000  # WarmupConsts::kMaxNumRecords
# PredictionLog log types TF Serving runs; the local server only has Predict.
_LOG_TYPE_NUMBERS = {
    name: field.number
    for name, field in prediction_log_pb2.PredictionLog.DESCRIPTOR.fields_by_name.items()
}


def run_warmup(servable: Servable, iterations: int, check_method_name: bool) -> None:
    """Replays the version's warmup records; raises ServingError to fail the load."""
    path = os.path.join(servable.path, ASSETS_EXTRA, WARMUP_FILENAME)
    if not os.path.exists(path):
        log.info("No warmup data file found at %s", path)
        return
    options = f"num_request_iterations {{ value: {iterations} }}" if iterations > 0 else ""
    log.info(
        "Starting to read warmup data for model at %s with model-warmup-options %s", path, options
    )
    started = time.monotonic()
    count = 0
    try:
        for record in tf.compat.v1.io.tf_record_iterator(path):
            prediction_log = _parse(record, path)
            for _ in range(max(iterations, 1)):
                _run_record(servable, prediction_log, check_method_name)
            count += 1
            if count > MAX_RECORDS:
                raise invalid_argument(
                    f"Number of warmup records exceeds the maximum ({MAX_RECORDS}) at {path}"
                )
    except tf.errors.DataLossError as exc:
        raise ServingError(
            grpc.StatusCode.DATA_LOSS,
            f"{exc.message}. Please verify your warmup data is in TFRecord format.",
        ) from None
    elapsed_us = int((time.monotonic() - started) * 1e6)
    log.info(
        "Finished reading warmup data for model at %s. Number of warmup records read: %d. "
        "Elapsed time (microseconds): %d.",
        path,
        count,
        elapsed_us,
    )


def _parse(record: bytes, path: str) -> prediction_log_pb2.PredictionLog:
    try:
        return prediction_log_pb2.PredictionLog.FromString(record)
    except Exception:  # protobuf raises DecodeError, or RuntimeError with the upb backend
        text = record.decode("utf-8", errors="backslashreplace")
        raise invalid_argument(f"Failed to parse warmup record: {text} from {path}") from None


def _run_record(
    servable: Servable, prediction_log: prediction_log_pb2.PredictionLog, check_method_name: bool
) -> None:
    log_type = prediction_log.WhichOneof("log_type")
    if log_type is None:
        return  # TF Serving skips records without a log type.
    if log_type != "predict_log":
        # TF Serving also replays classify/regress/multi_inference; the local server
        # implements Predict only, so it refuses them with TF Serving's text for the
        # types it cannot run.
        raise ServingError(
            grpc.StatusCode.UNIMPLEMENTED,
            f"Unsupported log_type for warmup: {_LOG_TYPE_NUMBERS[log_type]}",
        )
    run_predict(servable, prediction_log.predict_log.request, check_method_name=check_method_name)
