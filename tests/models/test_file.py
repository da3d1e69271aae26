"""The per-model config file: what it sets, and the clear refusals of bad files."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.models import (
    InputPrep,
    ModelConfigError,
    default_registry,
    load_registry,
)
from tests.support.modelconfigs import TASKS, config

DETECTION, CLASSIFICATION = "detection", "classification"
ROOT = Path(__file__).resolve().parents[2]




def test_the_reference_config_loads_every_reference_model():
    registry = load_registry(ROOT / "serving" / "gateway-models.toml", "detector", tasks=TASKS)
    assert registry.default_model == "detector"
    assert registry.default_for(DETECTION) == "detector"
    assert registry.default_for(CLASSIFICATION) == "classifier"
    logits = registry.get("classifier_logits", CLASSIFICATION)
    assert logits.input == InputPrep(
        scale=1 / 255, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), layout="NCHW"
    )
    assert logits.labels.label(2) == "blue" and logits.labels.index("black") == 7
    assert registry.get("classifier", CLASSIFICATION).input.string_encoding == "base64url"
    assert registry.get("detector", DETECTION).labels.label(1)


def test_without_a_file_every_model_is_detection():
    registry = default_registry("detector", default_task="detection")
    assert registry.get("anything", DETECTION).task == DETECTION
    assert registry.default_for(DETECTION) == "detector"
    assert registry.default_for(CLASSIFICATION) is None


def test_labels_and_defaults_are_read_relative_to_the_file(tmp_path):
    registry = load_registry(
        config(
            tmp_path,
            """
default_model = "resnet"
[models.resnet]
task = "classification"
labels = "labels.txt"
top_k = 2
min_score = 0.1
[models.resnet.input]
resize = [224, 224]
[models.ssd]
task = "detection"
label_map = "label_map.pbtxt"
max_detections = 20
[models.ssd.input]
max_side = 1024
""",
        ),
        "detector",
        tasks=TASKS,
    )
    resnet = registry.get("resnet", CLASSIFICATION)
    assert (resnet.task_config.top_k, resnet.task_config.min_score, resnet.input.resize) == (
        2,
        0.1,
        (224, 224),
    )
    assert resnet.labels.label(1) == "dog"
    assert registry.default_for(CLASSIFICATION) == "resnet"
    assert registry.default_for(DETECTION) is None  # --model is overridden by the file
    ssd = registry.get("ssd", DETECTION)
    assert (ssd.task_config.max_detections, ssd.input.max_side, ssd.labels.label(1)) == (
        20,
        1024,
        "person",
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[models.a]\ntask = "detection"\nlable_map = "x"\n', "unknown key 'models.a.lable_map'"),
        ("colour = 1\n", "unknown key 'colour'"),
        ('[models.a]\ntask = "segmentation"\n', "models.a.task must be one of"),
        (
            '[models.a]\ntask = "detection"\n[models.a.input]\nlayuot = "NCHW"\n',
            "'models.a.input.layuot'",
        ),
        (
            '[models.a]\ntask = "classification"\nlabel_map = "label_map.pbtxt"\n',
            "models.a.label_map is an OD API (detection) label map",
        ),
        ('[models.a]\ntask = "detection"\ntop_k = 3\n', "unknown key 'models.a.top_k'"),
        (
            '[models.a]\ntask = "classification"\n[models.a.input]\n'
            "resize = [224, 224]\nmax_side = 512\n",
            "both resize and max_side",
        ),
        (
            '[models.a]\ntask = "classification"\n[models.a.input]\ndtype = "uint8"\nscale = 0.5\n',
            "scale, mean and std need dtype = 'float32'",
        ),
        (
            '[models.a]\ntask = "classification"\n[models.a.input]\n'
            'string_encoding = "base64url"\nmean = [1, 2, 3]\n',
            "string_encoding is for models that take encoded images",
        ),
        (
            '[models.a]\ntask = "classification"\n[models.a.input]\nstd = [1, 0, 1]\n',
            "std must not contain 0",
        ),
        (
            '[models.a]\ntask = "classification"\n[models.a.input]\nmean = [1, 2]\n',
            "mean must be three numbers",
        ),
        (
            '[models.a]\ntask = "classification"\n[models.a.input]\nresize = [true, true]\n',
            "models.a.input.resize must be [height, width] in pixels",
        ),
        (
            '[models.a]\ntask = "detection"\nmin_score = 2\n',
            "min_score must be a number in [0.0, 1.0]",
        ),
        ('[models.a]\ntask = "classification"\nlabels = "missing.txt"\n', "cannot read labels"),
        (
            '[defaults]\ndetection = "c"\n[models.c]\ntask = "classification"\n',
            "configured with task = 'classification'",
        ),
        ("[models.a\n", "not valid TOML"),
        (
            '[models.a]\ntask = "classification"\n[models.a.outputs]\nboxes = "b"\n',
            "unknown key 'models.a.outputs.boxes'",
        ),
        (
            '[models.a]\ntask = "classification"\n[models.a.outputs]\n'
            'probabilities = "p"\nlogits = "l"\n',
            "sets probabilities and logits",
        ),
        (
            '[models.a]\ntask = "classification"\n[models.a.outputs]\nlabel = "l"\n',
            "outputs.label and .confidence go together",
        ),
        (
            '[models.a]\ntask = "classification"\n[models.a.outputs]\n'
            'logits_activation = "sigmoid"\n',
            "logits_activation needs logits",
        ),
        (
            '[models.a]\ntask = "detection"\n[models.a.outputs]\nbox_format = "xyzw"\n',
            "models.a.outputs.box_format must be one of yxyx, xyxy, xywh, cxcywh",
        ),
        (
            '[models.a]\ntask = "detection"\n[models.a.outputs]\nimage_info = "info"\n',
            "outputs.image_info is for box_coordinates = 'image_info'",
        ),
        (
            '[models.a]\ntask = "detection"\n[models.a.outputs]\nnms_iou = 0.5\n',
            "outputs.nms_iou and .max_candidates are for decoder = 'yolo'",
        ),
        (
            '[models.a]\ntask = "detection"\n[models.a.outputs]\ndecoder = "yolo"\nboxes = "b"\n',
            "remove boxes",
        ),
        (
            '[models.a]\ntask = "detection"\n[models.a.outputs]\ndecoder = "ssd"\n',
            "outputs.decoder must be one of yolo",
        ),
        (
            '[models.a]\ntask = "detection"\n[models.a.input]\ntf_example_key = "x"\n',
            "tf_example_key is for string_encoding = 'tf_example'",
        ),
        (
            '[models.a]\ntask = "detection"\n[models.a.input]\n'
            'string_encoding = "tf_example"\nchannel_order = "BGR"\n',
            "string_encoding is for models that take encoded images",
        ),
        ('[models.a]\ntask = "detection"\nsignature = ""\n', "signature must be a signature"),
        (
            '[models.a]\ntask = "classification"\n[models.a.input]\nresize_filter = "bilinear"\n',
            "models.a.input.resize_filter must be one of pillow-bilinear, pillow-bicubic, "
            "tf-bilinear, tf-bilinear-antialias, nearest, got 'bilinear'",
        ),
        (
            '[models.a]\ntask = "classification"\n[models.a.input]\n'
            'string_encoding = "base64url"\nresize_filter = "nearest"\n',
            "channel_order and resize_filter are for models that take pixels",
        ),
    ],
)
def test_bad_files_are_refused_naming_the_key(tmp_path, text, message):
    with pytest.raises(ModelConfigError, match=r"models\.toml") as info:
        load_registry(config(tmp_path, text), "detector", tasks=TASKS)
    assert message in str(info.value)


def test_an_unreadable_file_is_named(tmp_path):
    with pytest.raises(ModelConfigError, match=r"cannot read model config .*nope\.toml"):
        load_registry(tmp_path / "nope.toml", "detector", tasks=TASKS)


def test_outputs_input_and_signature_are_read(tmp_path):
    registry = load_registry(
        config(
            tmp_path,
            """
[models.mg]
task = "detection"
signature = "serving_example"
[models.mg.input]
string_encoding = "tf_example"
tf_example_key = "image/bytes"
[models.mg.outputs]
box_coordinates = "image_info"
class_offset = -1

[models.yolo]
task = "detection"
[models.yolo.outputs]
decoder = "yolo"
nms_iou = 0.6

[models.resnet]
task = "classification"
[models.resnet.input]
channel_order = "BGR"
mean = [103.939, 116.779, 123.68]
dtype = "float32"
name = "inputs"
[models.resnet.outputs]
logits = "output_0"
logits_activation = "sigmoid"
""",
        ),
        "mg",
        tasks=TASKS,
    )
    mg = registry.get("mg", DETECTION)
    assert mg.signature == "serving_example"
    assert (mg.input.string_encoding, mg.input.tf_example_key) == ("tf_example", "image/bytes")
    assert (mg.task_config.outputs.box_coordinates, mg.task_config.outputs.class_offset) == (
        "image_info",
        -1,
    )
    assert mg.task_config.outputs.declared == {"box_coordinates", "class_offset"}
    yolo = registry.get("yolo", DETECTION).task_config.outputs
    assert (yolo.decoder, yolo.nms_iou, yolo.max_candidates) == ("yolo", 0.6, 1000)
    resnet = registry.get("resnet", CLASSIFICATION)
    assert (resnet.input.channel_order, resnet.input.name) == ("BGR", "inputs")
    assert (resnet.task_config.outputs.logits, resnet.task_config.outputs.logits_activation) == (
        "output_0",
        "sigmoid",
    )
    assert registry.signature_names() == {"mg": "serving_example"}


def test_resize_filter_is_read_and_absent_means_the_fast_path(tmp_path):
    text = (
        '[models.vit]\ntask = "classification"\n[models.vit.input]\n'
        'resize_filter = "pillow-bicubic"\n[models.ssd]\ntask = "detection"\n'
    )
    registry = load_registry(config(tmp_path, text), "ssd", tasks=TASKS)
    assert registry.get("vit", CLASSIFICATION).input.resize_filter == "pillow-bicubic"
    assert registry.get("ssd", DETECTION).input.resize_filter is None
