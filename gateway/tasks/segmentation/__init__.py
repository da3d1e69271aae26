"""The instance segmentation task (segmentation.v1): instances with a mask each, in pixels of
the image as a viewer shows it, as COCO RLE, polygons or PNG; from TF Model Garden / OD API
Mask R-CNN-style box-relative `detection_masks`."""

from gateway.tasks.segmentation.task import SegmentationTask

__all__ = ["TASK", "SegmentationTask"]

TASK = SegmentationTask()
