"""The embedding task: a model's float [batch, D] output -> the image's unit-length vector.

The output read is the one named `embedding` in the signature, or its only float matrix.
`dimensions` keeps the leading dimensions before normalising (as Matryoshka-trained models
allow); 0 keeps all of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from gateway import errors
from gateway.api.bindings import Binding
from gateway.config import Settings
from gateway.models import ModelConfig, ModelConfigError
from gateway.models.values import COMMON_KEYS, refuse_unknown
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.tasks.base import Frame, OutputError, OutputPlan
from gateway.upstream.signatures import Signature
from gateway.upstream.tensors import Tensor, as_array

EMBEDDING = "embedding"
_FLOATS = (tfs.DT_FLOAT, tfs.DT_DOUBLE, tfs.DT_HALF)


class EmbedOptions(NamedTuple):
    """As the caller gave them; 0 means all dimensions."""

    dimensions: int = 0


class Embedding(NamedTuple):
    vector: tuple[float, ...]


class EmbeddingTask:
    name = EMBEDDING

    def __init__(self, binding: Binding) -> None:
        self.binding = binding

    def read_config(self, table: Mapping[str, Any], path: Path, where: str) -> None:
        """No keys of its own: the common ones only."""
        refuse_unknown(table, set(COMMON_KEYS), str(path), where + ".")
        if table.get("outputs"):
            raise ModelConfigError(f"{path}: {where}.outputs: the embedding task has no keys")

    def resolve(self, options: EmbedOptions, config: ModelConfig, settings: Settings) -> int:
        if options.dimensions < 0:
            raise errors.invalid_input(
                f"dimensions must be >= 0 (0 keeps them all), got {options.dimensions}"
            )
        return options.dimensions

    def output_plan(self, signature: Signature, config: ModelConfig) -> OutputPlan:
        matrices = [
            key
            for key, spec in sorted(signature.outputs.items())
            if spec.dtype in _FLOATS and (spec.shape is None or len(spec.shape) == 2)
        ]
        if EMBEDDING in matrices:
            return OutputPlan((EMBEDDING,))
        if len(matrices) == 1:
            return OutputPlan((matrices[0],))
        raise errors.bad_model(
            f"model '{signature.model}' version {signature.version} cannot be used for "
            f"embeddings: its signature has {signature.describe()}; the task needs a float "
            "[batch, dimensions] output named 'embedding', or a single float matrix output"
        )

    def map(
        self,
        outputs: Mapping[str, Tensor],
        plan: OutputPlan,
        frame: Frame,
        options: int,
        config: ModelConfig,
    ) -> Embedding:
        (key,) = plan.output_filter
        if key not in outputs:
            raise OutputError(f"TF Serving response lacks output '{key}'")
        values = as_array(outputs[key])
        if values.dtype.kind != "f" or values.ndim != 2 or values.shape[0] < 1:
            raise OutputError(f"{key} is {values.dtype} {list(values.shape)}; expected [1, D]")
        row = values[0].astype(np.float64)
        if options:
            row = row[:options]
        norm = float(np.linalg.norm(row))
        if not np.isfinite(norm) or norm == 0.0:
            raise OutputError(f"{key} has no direction (its norm is {norm})")
        return Embedding(tuple((row / norm).tolist()))

    def summary(self, result: Embedding) -> dict[str, object]:
        return {"dimensions": len(result.vector)}
