"""The classification task: a classifier's outputs -> classes ranked by score.

Three output forms, looked for in this order in the `serving_default` signature:
- `probabilities` or `scores`: float [batch, C] -> top-k here, names from the model's labels;
- `logits`: float [batch, C] -> softmax, then as above;
- `label` string [batch] + `confidence` float [batch]: top-1 decided in the graph (as a
  Hugging Face ViT exported with its pipeline gives); `class_id` is the label's index in the
  model's labels, or -1 when it is not among them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from gateway import errors
from gateway.config import Settings
from gateway.core.domain import Classes, ClassifyOptions, ScoredClass
from gateway.models import CLASSIFICATION, DEFAULT_TOP_K, ModelConfig
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.tasks.base import Frame, OutputError, OutputPlan
from gateway.upstream.signatures import Signature
from gateway.upstream.tensors import Tensor, as_array

PROBABILITIES = ("probabilities", "scores")
LOGITS = "logits"
LABEL, CONFIDENCE = "label", "confidence"
# Probabilities may miss [0, 1] or a sum of 1 by rounding (float32 softmax, quantised
# models); further off, the output is something else and would rank garbage.
PROBABILITY_TOLERANCE = 1e-3
# The most classes a request may ask for; more would only grow the response.
MAX_TOP_K = 1000


class ClassificationSettings(NamedTuple):
    top_k: int
    min_score: float


class ClassificationTask:
    name = CLASSIFICATION

    def resolve(
        self, options: ClassifyOptions, config: ModelConfig, settings: Settings
    ) -> ClassificationSettings:
        top_k = config.top_k or DEFAULT_TOP_K
        min_score = config.min_score or 0.0
        if options.top_k < 0 or options.top_k > MAX_TOP_K:
            raise errors.invalid_input(
                f"top_k must be in [0, {MAX_TOP_K}] (0 means the model's default {top_k}), "
                f"got {options.top_k}"
            )
        if math.isnan(options.min_score) or not 0.0 <= options.min_score <= 1.0:
            raise errors.invalid_input(
                f"min_score must be in [0, 1] (0 means the model's default {min_score}), "
                f"got {options.min_score}"
            )
        return ClassificationSettings(
            top_k=options.top_k or top_k, min_score=options.min_score or min_score
        )

    def output_plan(self, signature: Signature, config: ModelConfig) -> OutputPlan:
        outputs = signature.outputs
        for key in PROBABILITIES:
            if key in outputs and _is_float_matrix(outputs[key].dtype, outputs[key].shape):
                return OutputPlan((key,), "probabilities")
        if LOGITS in outputs and _is_float_matrix(outputs[LOGITS].dtype, outputs[LOGITS].shape):
            return OutputPlan((LOGITS,), "logits")
        if (
            LABEL in outputs
            and CONFIDENCE in outputs
            and outputs[LABEL].dtype == tfs.DT_STRING
            and outputs[CONFIDENCE].dtype in (tfs.DT_FLOAT, tfs.DT_DOUBLE, tfs.DT_HALF)
        ):
            return OutputPlan((LABEL, CONFIDENCE), "label")
        raise errors.bad_model(
            f"model '{signature.model}' version {signature.version} cannot be used for "
            f"classification: its 'serving_default' signature has {signature.describe()}; "
            "classification needs float [batch, classes] 'probabilities' or 'scores', float "
            "[batch, classes] 'logits', or string 'label' with float 'confidence'"
        )

    def map(
        self,
        tensors: Mapping[str, Tensor],
        plan: OutputPlan,
        frame: Frame,
        options: ClassificationSettings,
        config: ModelConfig,
    ) -> Classes:
        outputs = {key: as_array(tensor) for key, tensor in tensors.items()}
        if plan.form == "label":
            return Classes(_top_label(outputs, options, config))
        (key,) = plan.output_filter
        row = _first_row(outputs, key)
        if plan.form == "logits":
            if not np.isfinite(row).all():
                raise OutputError(f"{key} holds NaN or infinite values")
            shifted = np.exp(row - row.max())
            row = shifted / shifted.sum()
        else:
            _check_probabilities(row, key)
            row = np.clip(row, 0.0, 1.0)
        labels = config.labels
        if labels.names and len(row) != len(labels.names):
            raise OutputError(
                f"{key} has {len(row)} classes but the model's labels name {len(labels.names)}"
            )
        count = min(options.top_k, len(row))
        # Stable ranking: equal scores keep class order, so results do not flicker.
        order = np.argsort(-row, kind="stable")[:count]
        return Classes(
            [
                ScoredClass(int(i), labels.label(int(i)), float(row[i]))
                for i in order
                if row[i] >= options.min_score
            ]
        )

    def summary(self, result: Classes) -> dict[str, object]:
        top = result.classes[0] if result.classes else None
        return {"classes": len(result.classes), "top": top.label if top else None}


def _is_float_matrix(dtype: int, shape: tuple[int, ...] | None) -> bool:
    return dtype in (tfs.DT_FLOAT, tfs.DT_DOUBLE, tfs.DT_HALF) and (
        shape is None or len(shape) == 2
    )


def _first_row(outputs: Mapping[str, np.ndarray], key: str) -> np.ndarray:
    if key not in outputs:
        raise OutputError(f"TF Serving response lacks output '{key}'")
    values = outputs[key]
    if values.dtype.kind != "f":
        raise OutputError(f"{key} has dtype {values.dtype}; expected floats")
    if values.ndim != 2 or values.shape[0] < 1 or values.shape[1] < 1:
        raise OutputError(f"{key} has shape {list(values.shape)}; expected [1, classes]")
    return values[0].astype(np.float64)


def _check_probabilities(row: np.ndarray, key: str) -> None:
    with np.errstate(invalid="ignore"):
        bad = ~((row >= -PROBABILITY_TOLERANCE) & (row <= 1 + PROBABILITY_TOLERANCE))
    if bad.any():
        i = int(np.argmax(bad))
        raise OutputError(
            f"{key}[{i}] is {float(row[i])}; probabilities must be in [0, 1] (a model that "
            "returns logits should name the output 'logits')"
        )
    total = float(row.sum())
    if abs(total - 1.0) > max(PROBABILITY_TOLERANCE * len(row), 0.01):
        raise OutputError(
            f"{key} sums to {total:.4f}, not 1: not a probability distribution (name the "
            "output 'logits' if it holds logits)"
        )


def _top_label(
    outputs: Mapping[str, np.ndarray], options: ClassificationSettings, config: ModelConfig
) -> list[ScoredClass]:
    for key in (LABEL, CONFIDENCE):
        if key not in outputs:
            raise OutputError(f"TF Serving response lacks output '{key}'")
    labels, confidence = outputs[LABEL], outputs[CONFIDENCE]
    if labels.size < 1 or confidence.size < 1:
        raise OutputError(f"{LABEL} or {CONFIDENCE} is empty")
    raw = labels.reshape(-1)[0]
    if not isinstance(raw, bytes | str):
        raise OutputError(f"{LABEL} holds {labels.dtype}; expected strings")
    name = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
    score = float(confidence.reshape(-1)[0])
    if not 0.0 <= score <= 1.0:
        raise OutputError(f"{CONFIDENCE} is {score}; expected a number in [0, 1]")
    if score < options.min_score:
        return []
    return [ScoredClass(config.labels.index(name), name, score)]
