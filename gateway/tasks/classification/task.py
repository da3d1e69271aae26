"""The classification task: a classifier's outputs -> classes ranked by score.

Three output forms, named in `[models.NAME.outputs]` or else looked for in this order in the
signature:
- `probabilities` (or an output named `probabilities`, `scores` or `probs`): float
  [batch, C] -> top-k here, names from the model's labels;
- `logits` (or an output so named): float [batch, C] -> softmax (or sigmoid, with
  `logits_activation = "sigmoid"`, for multi-label models), then as above;
- `label` string [batch] + `confidence` float [batch]: top-1 decided in the graph (as a
  Hugging Face ViT exported with its pipeline gives); `class_id` is the label's index in the
  model's labels, or -1 when it is not among them.
A signature whose only output is float [batch, C] (Keras `output_0`, `predictions`) is read
as probabilities; the check per request refuses values that are not, naming `logits`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from gateway import errors
from gateway.domain import Cost, Frame, OutputError, OutputPlan
from gateway.models import ModelConfig
from gateway.models.limits import Rules
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.tasks.base import FolderTask, described
from gateway.tasks.classification.compare import compare_classes
from gateway.tasks.classification.config import ClassificationConfig
from gateway.tasks.classification.nouns import Classes, ClassifyOptions, ScoredClass
from gateway.tasks.decoders import scores as score_forms
from gateway.upstream.signatures import Signature
from gateway.upstream.tensors import Tensor, as_array

PROBABILITIES = ("probabilities", "scores", "probs")
LOGITS = "logits"
LABEL, CONFIDENCE = "label", "confidence"
# Probabilities may miss [0, 1] or a sum of 1 by rounding (float32 softmax, quantised
# models); further off, the output is something else and would rank garbage.
PROBABILITY_TOLERANCE = 1e-3
# The most classes a request may ask for; more would only grow the response.
MAX_TOP_K = 1000
CLASS_BYTES = 100  # one class in proto JSON: id, label, score


class ClassificationSettings(NamedTuple):
    top_k: int
    min_score: float


_FLOATS = (tfs.DT_FLOAT, tfs.DT_DOUBLE, tfs.DT_HALF)


def _is_float_matrix(dtype: int, shape: tuple[int, ...] | None) -> bool:
    return dtype in _FLOATS and (shape is None or len(shape) == 2)


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
            f"{key}[{i}] is {float(row[i])}; probabilities must be in [0, 1] (if the model "
            f"returns logits, set outputs.logits = '{key}' in the model config)"
        )
    total = float(row.sum())
    if abs(total - 1.0) > max(PROBABILITY_TOLERANCE * len(row), 0.01):
        raise OutputError(
            f"{key} sums to {total:.4f}, not 1: not a probability distribution (set "
            f"outputs.logits = '{key}' in the model config if it holds logits)"
        )


def _top_label(
    outputs: Mapping[str, np.ndarray],
    options: ClassificationSettings,
    config: ModelConfig,
    label_key: str = LABEL,
    confidence_key: str = CONFIDENCE,
) -> list[ScoredClass]:
    for key in (label_key, confidence_key):
        if key not in outputs:
            raise OutputError(f"TF Serving response lacks output '{key}'")
    labels, confidence = outputs[label_key], outputs[confidence_key]
    if labels.size < 1 or confidence.size < 1:
        raise OutputError(f"{label_key} or {confidence_key} is empty")
    raw = labels.reshape(-1)[0]
    if not isinstance(raw, bytes | str):
        raise OutputError(f"{label_key} holds {labels.dtype}; expected strings")
    name = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
    score = float(confidence.reshape(-1)[0])
    if not 0.0 <= score <= 1.0:
        raise OutputError(f"{confidence_key} is {score}; expected a number in [0, 1]")
    if score < options.min_score:
        return []
    return [ScoredClass(config.labels.index(name), name, score)]


@dataclass(frozen=True)
class ClassificationPlan(OutputPlan):
    """Which outputs hold the scores of one model version, and how to read them."""

    activation: str = "softmax"  # for logits
    source: str = ""  # why this output: "model config" or the rule that recognised it

    def describe(self) -> dict[str, object]:
        plan: dict[str, object] = {"form": self.form, "found by": self.source}
        if self.form == "label":
            plan["label"], plan["confidence"] = self.output_filter
        else:
            plan[self.form] = self.output_filter[0]
        if self.form == "logits":
            plan["activation"] = self.activation
        return plan


def plan_outputs(signature: Signature, own: ClassificationConfig) -> ClassificationPlan:
    """The classification plan for `signature` with the model config's `[outputs]`."""
    outputs = signature.outputs
    mapping = own.outputs
    what, shown = described(signature)
    declared = [
        (key, name)
        for key, name in (
            ("probabilities", mapping.probabilities),
            ("logits", mapping.logits),
            ("label", mapping.label),
            ("confidence", mapping.confidence),
        )
        if name is not None
    ]
    for key, name in declared:
        if name not in outputs:
            raise errors.bad_model(
                f"the model config says outputs.{key} = '{name}' but {what} has no such "
                f"output: {shown}"
            )
    for key, name in declared:
        spec = outputs[name]
        if key == "label":
            ok = spec.dtype == tfs.DT_STRING
        elif key == "confidence":
            ok = spec.dtype in _FLOATS
        else:
            ok = _is_float_matrix(spec.dtype, spec.shape)
        if not ok:
            wanted = {"label": "strings", "confidence": "floats"}.get(key, "float [batch, classes]")
            raise errors.bad_model(
                f"{what}: output '{name}' (outputs.{key}) is {spec.describe()}; expected {wanted}"
            )
    if mapping.probabilities is not None:
        return ClassificationPlan((mapping.probabilities,), "probabilities", source="model config")
    if mapping.logits is not None:
        return ClassificationPlan(
            (mapping.logits,), "logits", mapping.logits_activation, "model config"
        )
    if mapping.label is not None and mapping.confidence is not None:
        return ClassificationPlan(
            (mapping.label, mapping.confidence), "label", source="model config"
        )
    for key in PROBABILITIES:
        if key in outputs and _is_float_matrix(outputs[key].dtype, outputs[key].shape):
            return ClassificationPlan((key,), "probabilities", source=f"output named '{key}'")
    if LOGITS in outputs and _is_float_matrix(outputs[LOGITS].dtype, outputs[LOGITS].shape):
        return ClassificationPlan((LOGITS,), "logits", source="output named 'logits'")
    if (
        LABEL in outputs
        and CONFIDENCE in outputs
        and outputs[LABEL].dtype == tfs.DT_STRING
        and outputs[CONFIDENCE].dtype in _FLOATS
    ):
        return ClassificationPlan((LABEL, CONFIDENCE), "label", source="outputs named so")
    floats = [k for k, v in outputs.items() if _is_float_matrix(v.dtype, v.shape)]
    if len(outputs) == 1 and floats:
        return ClassificationPlan(
            (floats[0],), "probabilities", source="the signature's only output"
        )
    hint = ""
    if floats:
        hint = f" (float [batch, classes] outputs here: {', '.join(sorted(floats))})"
    raise errors.bad_model(
        f"{what} cannot be used for classification as it is: {shown}. Say which output "
        "holds the scores in the model config: outputs.probabilities = '<output>', "
        "outputs.logits = '<output>' (softmax; logits_activation = 'sigmoid' for multi-label), "
        f"or outputs.label + outputs.confidence{hint}"
    )


class ClassificationTask(FolderTask[ClassificationConfig]):
    compare = staticmethod(compare_classes)
    plan_outputs = staticmethod(plan_outputs)

    def resolve(
        self, options: ClassifyOptions, config: ModelConfig, rules: Rules
    ) -> ClassificationSettings:
        own = self.own(config)
        top_k, min_score = own.top_k, own.min_score
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
            label_key, confidence_key = plan.output_filter
            return Classes(_top_label(outputs, options, config, label_key, confidence_key))
        (key,) = plan.output_filter
        row = _first_row(outputs, key)
        if plan.form == "logits":
            if not np.isfinite(row).all():
                raise OutputError(f"{key} holds NaN or infinite values")
            activation = plan.activation if isinstance(plan, ClassificationPlan) else "softmax"
            row = score_forms.activate(row, activation)
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

    def cost(
        self, options: ClassificationSettings, frame: Frame, plan: OutputPlan, config: ModelConfig
    ) -> Cost:
        """The image decoded and top_k classes answered."""
        return Cost(frame.width * frame.height, 0, options.top_k * CLASS_BYTES, options.top_k)

    def summary(self, result: Classes) -> dict[str, object]:
        top = result.classes[0] if result.classes else None
        return {"classes": len(result.classes), "top": top.label if top else None}
