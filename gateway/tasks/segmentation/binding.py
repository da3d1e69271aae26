"""segmentation.v1 (SegmentationService: Segment, SegmentStream) <-> the instance
segmentation task's plain types."""

from __future__ import annotations

from gateway.api.bindings import Binding, page_script, served_model
from gateway.domain import Outcome
from gateway.proto.segmentation.v1 import segmentation_pb2 as pb
from gateway.tasks.segmentation import drawing
from gateway.tasks.segmentation.nouns import SegmentOptions, Segments

SEGMENTATION = "instance_segmentation"


def to_segmentation_result(outcome: Outcome) -> pb.SegmentationResult:
    assert isinstance(outcome.result, Segments)
    result = pb.SegmentationResult(
        image_width=outcome.image_width,
        image_height=outcome.image_height,
        model=served_model(outcome),
        request_id=outcome.request_id,
    )
    cut = outcome.result.truncated
    if cut is not None:
        result.truncated.instances_left_out = cut.left_out
        result.truncated.limit = cut.limit
        result.truncated.message = cut.message
    add = result.instances.add
    for found in outcome.result.instances:
        message = add(class_id=found.class_id, label=found.label, score=found.score)
        box = message.box
        box.x_min, box.y_min, box.x_max, box.y_max = found.box
        mask = found.mask
        message.mask.size.extend((mask.height, mask.width))
        if mask.counts is not None:
            message.mask.counts = mask.counts
        elif mask.png is not None:
            message.mask.png = mask.png
        else:
            add_polygon = message.mask.polygons.add
            for points in mask.polygons or ():
                add_polygon(points=points)
    return result


BINDING = Binding(
    task=SEGMENTATION,
    verb="segment",
    service=pb.DESCRIPTOR.services_by_name["SegmentationService"],
    unary="Segment",
    stream="SegmentStream",
    request_type=pb.SegmentRequest,
    result_type=pb.SegmentationResult,
    options_type=SegmentOptions,
    to_result=to_segmentation_result,
    summary="Segment object instances",
    options={
        "min_score": "minimum instance score, 0..1 (0: the model's default)",
        "max_detections": "most instances returned (0: the model's default)",
        "mask_threshold": "mask probability a pixel must exceed, 0..1 (0: the model's "
        "default, 0.5 unless its config says)",
        "mask_format": 'how masks are written: "rle" (COCO compressed RLE, the default), '
        '"polygon" or "png"',
    },
    page=page_script(__file__),
    draw=drawing.draw,
)
