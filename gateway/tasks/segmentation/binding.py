"""segmentation.v1 (SegmentationService: Segment, SegmentStream) <-> the instance
segmentation task's plain types."""

from __future__ import annotations

from gateway.api.bindings import Binding
from gateway.proto.segmentation.v1 import segmentation_pb2 as pb
from gateway.tasks.detection.binding import add_instance
from gateway.tasks.segmentation.nouns import SegmentOptions, Segments


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
    pb.DESCRIPTOR,
    SegmentOptions,
    fill_segments,
    summary="Segment object instances",
    task="instance_segmentation",
)
