"""Classification's model-config keys: `top_k` and `min_score` (request defaults) in
[models.NAME], and in [models.NAME.outputs] which output holds the scores where the names do
not say: `probabilities`, or `logits` (+ `logits_activation` softmax | sigmoid), or `label` +
`confidence` (ClassificationOutputs)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.models.values import (
    ModelConfigError,
    read_choice,
    read_integer,
    read_number,
)
from gateway.tasks.base import output_names, read_outputs, read_own_keys

# Classification's top_k when neither the request nor the model config gives one.
DEFAULT_TOP_K = 5
_NAMES = ("probabilities", "logits", "label", "confidence")
OUTPUT_KEYS = frozenset({*_NAMES, "logits_activation"})


@dataclass(frozen=True)
class ClassificationOutputs:
    probabilities: str | None = None
    logits: str | None = None
    logits_activation: str = "softmax"  # softmax | sigmoid (multi-label)
    label: str | None = None
    confidence: str | None = None


@dataclass(frozen=True)
class ClassificationConfig:
    top_k: int = DEFAULT_TOP_K
    min_score: float = 0.0
    outputs: ClassificationOutputs = field(default_factory=ClassificationOutputs)


DEFAULT = ClassificationConfig()


def read_config(table: Mapping[str, Any], path: Path, where: str) -> ClassificationConfig:
    """[models.NAME] of a classifier (`table`, at `where`); unknown keys refused by name."""
    if "label_map" in table:
        raise ModelConfigError(
            f"{path}: {where}.label_map is an OD API (detection) label map; classification "
            "models take labels = 'labels.txt' (one label per line, line k is class id k)"
        )
    read_own_keys(table, ("top_k", "min_score"), path, where)
    outputs, outputs_where = read_outputs(table, OUTPUT_KEYS, path, where)
    names = output_names(outputs, _NAMES, path, outputs_where)
    forms = [k for k in ("probabilities", "logits", "label") if k in outputs]
    if len(forms) > 1:
        raise ModelConfigError(
            f"{path}: {outputs_where} sets {' and '.join(forms)}; a classifier's scores are "
            "one of probabilities, logits, or label + confidence"
        )
    if ("label" in outputs) != ("confidence" in outputs):
        raise ModelConfigError(f"{path}: {outputs_where}.label and .confidence go together")
    activation = read_choice(
        outputs, "logits_activation", ("softmax", "sigmoid"), path, outputs_where
    )
    if activation is not None and "logits" not in outputs:
        raise ModelConfigError(
            f"{path}: {outputs_where}.logits_activation needs logits = '<output>'"
        )
    return ClassificationConfig(
        top_k=read_integer(table, "top_k", path, where) or DEFAULT_TOP_K,
        min_score=read_number(table, "min_score", path, where, 0.0, 1.0) or 0.0,
        outputs=ClassificationOutputs(**names, logits_activation=activation or "softmax"),
    )
