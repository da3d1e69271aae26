"""The embedding task: a model's float [batch, D] output -> the image's vector.

The output is the one `[models.NAME.outputs] embedding` names, or else the signature's only
float output of rank 2 (a Keras application exported with include_top=False and
pooling="avg" gives `output_0`; Hugging Face's TFViTModel gives `pooler_output` beside the
rank-3 `last_hidden_state`). Any other signature is refused at startup, naming the key.

Per request the row is truncated to the caller's `dimensions` (Matryoshka-trained models keep
their meaning in a prefix) and divided by its L2 norm, unless the model config says
`normalize = false`; a zero vector, which has no direction, is returned as it is with
`normalized` false.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from gateway import errors
from gateway.domain import Cost, Frame, OutputError, OutputPlan
from gateway.models import ModelConfig
from gateway.models.limits import Rules
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.tasks.base import FolderTask, described
from gateway.tasks.embedding.compare import compare_embeddings
from gateway.tasks.embedding.config import EmbeddingConfig
from gateway.tasks.embedding.nouns import Embedding, EmbedOptions
from gateway.upstream.signatures import Signature, TensorSpec
from gateway.upstream.tensors import Tensor, as_array

_FLOATS = (tfs.DT_FLOAT, tfs.DT_DOUBLE, tfs.DT_HALF, tfs.DT_BFLOAT16)
# The longest vector a request may ask for; far over any image model's (CLIP ViT-bigG: 1280).
MAX_DIMENSIONS = 65536
VALUE_BYTES = 24  # one float of the vector in proto JSON


@dataclass(frozen=True)
class EmbeddingPlan(OutputPlan):
    """Which output holds the vector of one model version, and how it is returned."""

    dimension: int = -1  # D from the signature; -1 when it does not say
    normalize: bool = True
    source: str = ""  # why this output: "model config" or the rule that recognised it

    def describe(self) -> dict[str, object]:
        return {
            "form": "embedding",
            "embedding": self.output_filter[0],
            "found by": self.source,
            "dimension": self.dimension if self.dimension > 0 else "unknown",
            "normalize": "L2" if self.normalize else "no (the model's values)",
        }


def _is_float_matrix(spec: TensorSpec) -> bool:
    return spec.dtype in _FLOATS and (spec.shape is None or len(spec.shape) == 2)


def _dimension(spec: TensorSpec) -> int:
    return spec.shape[1] if spec.shape is not None and len(spec.shape) == 2 else -1


def plan_outputs(signature: Signature, own: EmbeddingConfig) -> EmbeddingPlan:
    """The embedding plan for `signature` with the model config's `[outputs]`."""
    outputs = signature.outputs
    what, shown = described(signature)
    if own.embedding is not None:
        spec = outputs.get(own.embedding)
        if spec is None:
            raise errors.bad_model(
                f"the model config says outputs.embedding = '{own.embedding}' but {what} "
                f"has no such output: {shown}"
            )
        if not _is_float_matrix(spec):
            raise errors.bad_model(
                f"{what}: output '{own.embedding}' (outputs.embedding) is {spec.describe()}; "
                "expected float [batch, dimension] (a pooled feature vector per image)"
            )
        return EmbeddingPlan(
            (own.embedding,), "embedding", _dimension(spec), own.normalize, "model config"
        )
    matrices = sorted(key for key, spec in outputs.items() if _is_float_matrix(spec))
    if len(matrices) == 1:
        (key,) = matrices
        return EmbeddingPlan(
            (key,),
            "embedding",
            _dimension(outputs[key]),
            own.normalize,
            "the signature's only float [batch, dimension] output",
        )
    found = (
        f"it has {len(matrices)} float [batch, dimension] outputs ({', '.join(matrices)})"
        if matrices
        else "it has no float [batch, dimension] output (export the model with its "
        "features pooled, e.g. Keras include_top=False, pooling='avg')"
    )
    raise errors.bad_model(
        f"{what} cannot be used for embeddings as it is: {found}; {shown}. Say which "
        "output holds the vector in the model config: outputs.embedding = '<output>'"
    )


class EmbeddingTask(FolderTask[EmbeddingConfig]):
    compare = staticmethod(compare_embeddings)

    def resolve(self, options: EmbedOptions, config: ModelConfig, rules: Rules) -> int:
        """The caller's `dimensions` (0: all of them)."""
        if not 0 <= options.dimensions <= MAX_DIMENSIONS:
            raise errors.invalid_input(
                f"dimensions must be in [0, {MAX_DIMENSIONS}] (0 keeps the model's whole "
                f"vector), got {options.dimensions}"
            )
        return options.dimensions

    plan_outputs = staticmethod(plan_outputs)

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
            raise OutputError(
                f"{key} is {values.dtype} {list(values.shape)}; expected floats [1, dimension]"
            )
        row = values[0].astype(np.float64)
        if row.size == 0:
            raise OutputError(f"{key} is empty: the model gives a vector of no dimensions")
        if not np.isfinite(row).all():
            raise OutputError(f"{key} holds NaN or infinite values")
        if options:
            if options > row.size:
                raise errors.invalid_input(
                    f"dimensions is {options} but model '{config.name}' gives {row.size}; "
                    f"ask for at most {row.size} (0 keeps them all)"
                )
            row = row[:options]
        normalize = plan.normalize if isinstance(plan, EmbeddingPlan) else True
        norm = float(np.linalg.norm(row)) if normalize else 0.0
        if norm > 0.0:
            return Embedding((row / norm).tolist(), True)
        return Embedding(row.tolist(), False)

    def cost(self, options: int, frame: Frame, plan: OutputPlan, config: ModelConfig) -> Cost:
        """The image decoded and the vector answered: the dimensions asked for, else the
        signature's (MAX_DIMENSIONS when it does not say)."""
        known = plan.dimension if isinstance(plan, EmbeddingPlan) and plan.dimension > 0 else 0
        values = options or known or MAX_DIMENSIONS
        return Cost(frame.width * frame.height, 0, values * VALUE_BYTES, values)

    def summary(self, result: Embedding) -> dict[str, object]:
        return {"dimension": len(result.vector), "normalized": result.normalized}
