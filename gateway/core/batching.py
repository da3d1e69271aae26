"""Which models' requests may share one Predict, and how many: the batch plan of one model
version, from its signature, its input plan and `[models.NAME.batching]`.

A batch stacks images along the input's first dimension, so it needs that dimension free
(-1) in the signature, every image's tensor the same shape, and every output the model is
asked for to have a free first dimension (so it splits back per image):
- fixed-size pixel inputs ([-1,H,W,3], [-1,3,H,W], or a `resize` from the config) and
  string inputs ([-1]) batch as they are; string images are grouped by the size they decode
  to (the OD API's encoded_image_string_tensor stacks the decoded images, so they must
  match);
- variable-size pixel inputs batch only letterboxed on `input.pad_to` (gateway.core.letterbox);
- a batch fixed at 1 (most OD API exports: [1,-1,-1,3]) is never batched.
`check-models` shows the plan and the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.core.inputs import InputMode, InputPlan
from gateway.domain import OutputPlan
from gateway.models.batching import BatchingConfig
from gateway.upstream.signatures import Signature

# Images per Predict unless the model config says otherwise (TF Serving's batching guide
# starts CPU models at small batches: latency grows with the batch, throughput much less).
DEFAULT_MAX_BATCH = 8


@dataclass(frozen=True)
class BatchPlan:
    """How one model version's requests are coalesced; max_batch 1: never."""

    max_batch: int = 1
    max_delay: float = 0.0  # seconds an image waits for company when the model is idle
    reason: str = "batching is not planned"

    @property
    def enabled(self) -> bool:
        return self.max_batch > 1

    def describe(self) -> dict[str, object]:
        """The plan as `check-models` and the startup log show it."""
        plan: dict[str, object] = {"enabled": self.enabled}
        if self.enabled:
            plan["max_batch"] = self.max_batch
            plan["max_delay_ms"] = round(self.max_delay * 1000, 3)
        plan["why"] = self.reason
        return plan


def plan_batching(
    signature: Signature, inputs: InputPlan, outputs: OutputPlan, config: BatchingConfig
) -> BatchPlan:
    """The batch plan of `signature` called with `inputs` for `outputs`."""
    if config.enabled is False:
        return BatchPlan(reason="batching.enabled = false in the model config")
    spec = signature.inputs[inputs.key]
    shape = spec.shape or ()
    shown = spec.describe()
    if not shape or shape[0] != -1:
        return BatchPlan(
            reason=f"the signature fixes the batch of input '{inputs.key}' ({shown}); only a "
            "free batch dimension (-1) can take several images"
        )
    if inputs.mode is InputMode.ENCODED:
        form = "encoded images, grouped by the size they decode to"
    elif inputs.pad_to is not None:
        form = "images letterboxed on the pad_to canvas"
    elif inputs.size is not None:
        form = "images resized to one size"
    else:
        return BatchPlan(
            reason=f"input '{inputs.key}' ({shown}) takes images at their own size, which "
            "differ from image to image; set input.pad_to = [height, width] in the model "
            "config to letterbox them onto one canvas and batch them"
        )
    wanted = outputs.output_filter or tuple(signature.outputs)
    for key in wanted:
        out = signature.outputs.get(key)
        if out is not None and out.shape is not None and (not out.shape or out.shape[0] != -1):
            return BatchPlan(
                reason=f"output '{key}' ({out.describe()}) has no free batch dimension, so a "
                "batch's answer could not be split back per image"
            )
    max_batch = config.max_batch or DEFAULT_MAX_BATCH
    if max_batch == 1:
        return BatchPlan(reason="batching.max_batch = 1 in the model config")
    delay = config.max_delay_ms / 1000
    when = "that queue while a call to the model is in flight"
    if delay:
        when += f", or for up to {config.max_delay_ms:g} ms when it is idle"
    return BatchPlan(max_batch, delay, f"{form} {when} go as one Predict of up to {max_batch}")
