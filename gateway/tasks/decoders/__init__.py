"""Output forms of real exporters, as small pure functions over numpy arrays.

- `boxes`: box formats (yxyx, xyxy, xywh, cxcywh) and coordinates (normalized, pixels of the
  image sent, Model Garden's `image_info`) -> normalized [ymin, xmin, ymax, xmax];
- `scores`: probabilities, logits (softmax or sigmoid);
- `nms`: class-wise non-maximum suppression;
- `yolo`: the raw `[batch, 4 + classes, candidates]` head of YOLOv5u/v8/v11 exports.

The tasks choose one per model version (gateway.tasks.detection / classification); nothing
here knows about signatures, configs or requests.
"""
