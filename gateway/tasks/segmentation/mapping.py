"""A segmentation model's outputs for one image -> instances with masks in pixels of the
image as a viewer shows it (per request, by the plan's form: gateway.tasks.segmentation.plans).

Boxes, scores and classes go through detection's decoding (gateway.tasks.detection.forms,
which hands back the rows it kept and their boxes in the image sent); each kept row's mask is
pasted into its box (gateway.tasks.segmentation.raster) and written in the requested format
(gateway.tasks.segmentation.encode).

The work is priced as it goes, best instance first: an instance's paste costs its box's pixels
(raster.footprint, known before the paste) and its mask's bytes; the instances past the
model's max_mask_pixels or max_answer_bytes are left out and the result says so
(Segments.truncated); when even the best one passes them the request is refused
(RESOURCE_EXHAUSTED) naming the setting. The request's deadline is checked before each
instance and each strip of a paste, so a late request stops within milliseconds."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from gateway import errors
from gateway.domain import Frame, OutputError, OutputPlan, Work
from gateway.labels import Labels
from gateway.models import ModelConfig
from gateway.tasks.decoders import yoloseg
from gateway.tasks.detection.forms import map_decoded
from gateway.tasks.detection.nouns import Detection
from gateway.tasks.segmentation import encode, inputmasks, raster
from gateway.tasks.segmentation.config import INPUT, YOLO_SEG
from gateway.tasks.segmentation.nouns import (
    PNG,
    POLYGON,
    Instance,
    Mask,
    Segments,
    SegmentSettings,
    Truncation,
)
from gateway.tasks.segmentation.plans import SegmentationPlan
from gateway.upstream.tensors import Tensor, as_array

# What tracing one polygon outline edge costs, in mask pixels pasted and written as RLE: ~4 us
# of Python against ~40 ns a pixel (bench/results.md, "Work priced before it runs").
EDGE_PIXELS = 100
# Polygon vertices in one result at most (each a pair of floats: about 20 bytes of JSON);
# masks with more outline than this are asked for as RLE or PNG.
MAX_POLYGON_POINTS = 1_000_000


def map_segments(
    outputs: Mapping[str, Tensor],
    plan: OutputPlan,
    frame: Frame,
    options: SegmentSettings,
    config: ModelConfig,
) -> Segments:
    """The task's `map` (gateway.api.task.Task.map)."""
    assert isinstance(plan, SegmentationPlan) and plan.detection is not None
    labels = config.labels
    try:
        axes = raster.raster_axes(frame.transform)
    except ValueError as e:
        raise OutputError(str(e)) from None
    if plan.form == YOLO_SEG:
        return _yolo_seg(outputs, plan, frame, labels, options, axes)
    if plan.masks not in outputs:
        raise OutputError(f"TF Serving response lacks output '{plan.masks}'")
    masks = as_array(outputs[plan.masks])
    if masks.dtype.kind != "f" or masks.ndim != 4 or masks.shape[0] < 1:
        raise OutputError(
            f"{plan.masks} is {masks.dtype} {list(masks.shape)}; expected float [1, N, m, m]"
        )
    found, rows, boxes = map_decoded(outputs, plan.detection, frame, labels, options)
    if len(rows) and int(rows.max()) >= masks.shape[1]:
        raise OutputError(f"{plan.masks} has {masks.shape[1]} rows but the detections have more")
    grids = masks[0, rows]
    if min(grids.shape[1:]) < 1 or not np.isfinite(grids).all():
        raise OutputError(f"{plan.masks} holds empty masks or NaN or infinite values")
    if grids.size and (grids.min() < -1e-3 or grids.max() > 1 + 1e-3):
        raise OutputError(f"{plan.masks} holds values outside [0, 1]; masks must be probabilities")
    shapes = [
        raster.box_mask(grid, box, axes, frame.width, frame.height)
        for grid, box in zip(grids, boxes.tolist(), strict=True)
    ]
    return written(found, shapes, axes, frame, options)


def _yolo_seg(
    outputs: Mapping[str, Tensor],
    plan: SegmentationPlan,
    frame: Frame,
    labels: Labels,
    options: SegmentSettings,
    axes: tuple[raster.Axis, raster.Axis],
) -> Segments:
    assert plan.detection is not None and plan.detection.head is not None
    head_key = plan.detection.head
    raw, prototypes = _floats(outputs, head_key), _floats(outputs, plan.prototypes)
    if frame.sent is None or frame.sent[0] <= 0 or frame.sent[1] <= 0:
        raise OutputError("the size of the image sent is unknown")
    try:
        layout = yoloseg.prototype_layout(prototypes.shape, frame.sent)
    except ValueError as e:
        raise OutputError(f"{plan.prototypes}: {e}") from None
    maps = prototypes[0] if layout == yoloseg.NCHW else prototypes[0].transpose(2, 0, 1)
    if raw.ndim != 3 or raw.shape[0] < 1:
        raise OutputError(
            f"{head_key} has shape {list(raw.shape)}; expected [1, 4 + classes + M, candidates]"
        )
    try:
        boxes_part, coefficients = yoloseg.split_head(raw[0], maps.shape[0])
    except ValueError as e:
        raise OutputError(f"{head_key}: {e}") from None
    if not (np.isfinite(coefficients).all() and np.isfinite(maps).all()):
        raise OutputError(f"{head_key} or {plan.prototypes} holds NaN or infinite values")
    found, rows, boxes = map_decoded(
        {head_key: boxes_part[None]}, plan.detection, frame, labels, options
    )
    grids = yoloseg.mask_logits(coefficients[:, rows], maps)
    whole = (0.0, 0.0, 1.0, 1.0)
    shapes = [
        raster.Shape(grid, whole, (box[0], box[1], box[2], box[3]), True, logits=True)
        for grid, box in zip(grids, boxes.tolist(), strict=True)
    ]
    if plan.mask_resolution != INPUT:
        return written(found, shapes, axes, frame, options)
    sent, shown = frame.sent, (frame.width, frame.height)

    def at_input(shape: raster.Shape, check: Callable[[], None]) -> raster.Placed:
        return inputmasks.at_input(shape.grid, shape.keep, sent, axes, shown,
                                   options.mask_threshold, check)  # fmt: skip

    return written(found, shapes, axes, frame, options, at_input)


def _floats(outputs: Mapping[str, Tensor], key: str) -> np.ndarray:
    if key not in outputs:
        raise OutputError(f"TF Serving response lacks output '{key}'")
    values = as_array(outputs[key])
    if values.dtype.kind != "f":
        raise OutputError(f"{key} has dtype {values.dtype}; expected floats")
    return values


def written(
    found: list[Detection],
    shapes: list[raster.Shape],
    axes: tuple[raster.Axis, raster.Axis],
    frame: Frame,
    options: SegmentSettings,
    place: Callable[[raster.Shape, Callable[[], None]], raster.Placed] | None = None,
) -> Segments:
    """Each detection with its mask pasted (or, given `place`, placed by it: YOLO-seg's
    mask_resolution = "input", priced as the paste) and written in the requested format,
    one at a time (only one instance's pixels are held at once), within the model's
    limits."""
    width, height = frame.width, frame.height
    work = frame.work if frame.work is not None else Work()
    limits = options.limits
    max_pixels = limits.max_mask_pixels if limits is not None else None
    max_bytes = limits.max_answer_bytes if limits is not None else None
    points = 0
    instances: list[Instance] = []
    cut: tuple[str, str] | None = None
    for detection, shape in zip(found, shapes, strict=True):
        work.check()
        pixels = raster.footprint(shape, axes, width, height)
        if max_pixels is not None and work.mask_pixels + pixels > max_pixels:
            cut = ("max_mask_pixels", f"{max_pixels} mask pixels")
            break
        work.mask_pixels += pixels
        if place is not None:
            placed = place(shape, work.check)
        else:
            placed = raster.paste(shape, axes, width, height, options.mask_threshold, work.check)
        if options.mask_format == POLYGON:
            edges = encode.boundary_edges(placed)
            # Tracing costs per outline edge (Python, ~4 us each): priced before it runs.
            if max_pixels is not None and work.mask_pixels + EDGE_PIXELS * edges > max_pixels:
                cut = ("max_mask_pixels", f"{max_pixels} mask pixels (a polygon outline's "
                       f"edge counts as {EDGE_PIXELS})")  # fmt: skip
                break
            work.mask_pixels += EDGE_PIXELS * edges
            points += edges
            if points > MAX_POLYGON_POINTS:
                raise errors.invalid_input(
                    f"the masks' outlines have over {MAX_POLYGON_POINTS} pixel edges, more "
                    "polygon points than a result may hold; ask for mask_format rle or png"
                )
            mask = Mask(height, width, polygons=encode.polygons(placed))
        elif options.mask_format == PNG:
            mask = Mask(height, width, png=encode.png(placed, width, height))
        else:
            counts = encode.rle_counts(placed, width, height)
            mask = Mask(height, width, counts=encode.rle_string(counts))
        size = _mask_bytes(mask)
        if max_bytes is not None and work.answer_bytes + size > max_bytes:
            cut = ("max_answer_bytes", f"{max_bytes} bytes of masks")
            break
        work.answer_bytes += size
        instances.append(
            Instance(detection.class_id, detection.label, detection.score, detection.box, mask)
        )
    if cut is None:
        return Segments(instances)
    assert limits is not None
    key, reached = cut
    left_out = len(found) - len(instances)
    where = limits.setting(key)
    if not instances:
        raise errors.too_costly(
            f"the best instance's mask alone passes model '{limits.model}''s limit of "
            f"{reached} per answer ({width}x{height} image); send a smaller image, ask for "
            f"mask_format rle, or have the operator raise {where}"
        )
    message = (
        f"{left_out} of {len(found)} instances left out: their masks would pass the limit of "
        f"{reached} per answer; ask for fewer (max_detections, min_score) or raise {where}"
    )
    return Segments(instances, Truncation(left_out, key, message))


def _mask_bytes(mask: Mask) -> int:
    """What a mask adds to an answer: its RLE characters or PNG bytes, or 8 bytes per polygon
    point (two floats of the protobuf; more in JSON)."""
    if mask.counts is not None:
        return len(mask.counts)
    if mask.png is not None:
        return len(mask.png)
    return 8 * sum(len(points) // 2 for points in mask.polygons or ())
