"""Predict on one loaded version, step for step like TF Serving's RunPredict.

Order and texts follow predict_util.cc (signature lookup, method-name check, input count,
output filter) and tensorflow/cc/saved_model/util.cc GetInputValues (aliases, defaults,
`tensor parsing error: <alias>`). Sets in messages are sorted and comma-joined as the C++
std::set / absl::StrJoin produce them.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
import numpy as np
from tensorflow.core.protobuf.meta_graph_pb2 import SignatureDef
from tensorflow_serving.apis import predict_pb2

from serving.local import tensors
from serving.local.errors import ServingError, failed_precondition, invalid_argument
from serving.local.servable import Servable

DEFAULT_SIGNATURE = "serving_default"
PREDICT_METHOD = "tensorflow/serving/predict"
CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"


def run_predict(
    servable: Servable,
    request: predict_pb2.PredictRequest,
    *,
    timeout_ms: int | None = None,
    as_tensor_content: bool = False,
    check_method_name: bool = False,
) -> predict_pb2.PredictResponse:
    """Runs a PredictRequest against `servable`; raises ServingError like TF Serving."""
    signature_name = request.model_spec.signature_name or DEFAULT_SIGNATURE
    if signature_name not in servable.signatures:
        raise failed_precondition(f'Serving signature key "{signature_name}" not found.')
    signature = servable.signatures[signature_name]
    response = predict_pb2.PredictResponse()
    response.model_spec.name = request.model_spec.name
    response.model_spec.signature_name = signature_name
    response.model_spec.version.value = servable.version

    if check_method_name:
        _verify_method_name(signature.method_name)
    _verify_inputs_size(signature, request)
    feeds = _input_values(signature, request)
    aliases, names = _fetches(signature, request.output_filter)
    outputs = servable.run(feeds, names, timeout_ms)
    for alias, array in zip(aliases, outputs, strict=True):
        value = np.asarray(array)
        response.outputs[alias].CopyFrom(
            tensors.to_proto(value, tensors.dtype_of(value), as_tensor_content)
        )
    return response


def _verify_method_name(method_name: str) -> None:
    if method_name not in (PREDICT_METHOD, CLASSIFY_METHOD, REGRESS_METHOD):
        raise ServingError(
            grpc.StatusCode.INTERNAL,
            "Expected prediction signature method_name to be one of "
            f"{{{PREDICT_METHOD}, {CLASSIFY_METHOD}, {REGRESS_METHOD}}}. Was: {method_name}",
        )


def _verify_inputs_size(signature: SignatureDef, request: predict_pb2.PredictRequest) -> None:
    sent, expected = set(request.inputs), set(signature.inputs)
    if len(sent) > len(expected) or (len(sent) < len(expected) and not signature.defaults):
        raise invalid_argument(
            f"input size does not match signature: {len(sent)}!={len(expected)} "
            f"len({{{_join(sent)}}}) != len({{{_join(expected)}}}). "
            f"Sent extra: {{{_join(sent - expected)}}}. "
            f"Missing but required: {{{_join(expected - sent)}}}."
        )


def _input_values(
    signature: SignatureDef, request: predict_pb2.PredictRequest
) -> list[tuple[str, np.ndarray]]:
    """GetInputValues: one feed per signature input, from the request or the defaults."""
    feeds: list[tuple[str, np.ndarray]] = []
    used: set[str] = set()
    for alias, info in signature.inputs.items():
        if alias in request.inputs:
            proto = request.inputs[alias]
            used.add(alias)
        elif alias in signature.defaults:
            proto = signature.defaults[alias]
        else:
            raise invalid_argument(
                f"Signature input alias: {alias}(feed name: {info.name}) not found in request "
                "and no default value provided. Inputs expected to be in the request "
                f"{{{_join(request.inputs)}}}, or default input alias set: "
                f"{_join(signature.defaults)}"
            )
        try:
            feeds.append((info.name, tensors.to_numpy(proto)))
        except tensors.TensorParseError:
            raise invalid_argument(f"tensor parsing error: {alias}") from None
    if request.inputs and len(used) != len(request.inputs):
        raise invalid_argument(
            f"Inputs contains invalid name. Used request inputs: {_join(used)}, "
            f"request input: {_join(request.inputs)}"
        )
    return feeds


def _fetches(signature: SignatureDef, output_filter: Iterable[str]) -> tuple[list[str], list[str]]:
    """Output aliases and tensor names: the filter in order, or every signature output."""
    aliases: list[str] = []
    for alias in output_filter:
        if alias not in signature.outputs:
            raise invalid_argument(
                f"output tensor alias not found in signature: {alias} Outputs expected to be "
                f"in the set {{{_join(signature.outputs)}}}."
            )
        if alias in aliases:
            raise invalid_argument(f"duplicate output tensor alias: {alias}")
        aliases.append(alias)
    if not aliases:
        aliases = list(signature.outputs)
    return aliases, [signature.outputs[alias].name for alias in aliases]


def _join(keys: Iterable[str]) -> str:
    return ",".join(sorted(keys))
