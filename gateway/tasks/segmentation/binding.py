"""segmentation.v1 (SegmentationService: Segment, SegmentStream) <-> the instance
segmentation task's plain types."""

from __future__ import annotations

from gateway.api.bindings import Binding
from gateway.proto.segmentation.v1 import segmentation_pb2 as pb
from gateway.tasks.detection.binding import add_instance
from gateway.tasks.segmentation.nouns import SegmentOptions, Segments

SEGMENTATION = "instance_segmentation"


def fill_segments(result: pb.SegmentationResult, found: Segments) -> None:
    cut = found.truncated
    if cut is not None:
        result.truncated.instances_left_out = cut.left_out
        result.truncated.limit = cut.limit
        result.truncated.message = cut.message
    add = result.instances.add
    for instance in found.instances:
        message = add_instance(add, instance)
        mask = instance.mask
        message.mask.size.extend((mask.height, mask.width))
        if mask.counts is not None:
            message.mask.counts = mask.counts
        elif mask.png is not None:
            message.mask.png = mask.png
        else:
            add_polygon = message.mask.polygons.add
            for points in mask.polygons or ():
                add_polygon(points=points)


BINDING = Binding.of(
    pb.DESCRIPTOR.services_by_name["SegmentationService"],
    task=SEGMENTATION,
    verb="segment",
    options_type=SegmentOptions,
    fill_result=fill_segments,
    summary="Segment object instances",
    options={
        "min_score": "minimum instance score, 0..1 (0: the model's default)",
        "max_detections": "most instances returned (0: the model's default)",
        "mask_threshold": "mask probability a pixel must exceed, 0..1 (0: the model's "
        "default, 0.5 unless its config says)",
        "mask_format": 'how masks are written: "rle" (COCO compressed RLE, the default), '
        '"polygon" or "png"',
    },
    package=__package__,
)
