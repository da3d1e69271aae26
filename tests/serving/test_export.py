"""The exported model versions look like TF Object Detection API TF2 exports (detectors) and
Hugging Face ViT exports (classifiers) to TF Serving.

Checks the SignatureDefs (read from saved_model.pb and through TensorFlow), the version
directory layout, the warmup records, the label map and labels.txt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format
from google.protobuf.message import Message
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2

from serving import export, scenes, warmup
from serving.reference import CLASSIFIER_PALETTE, LABELS_PATH, REFERENCE_MODELS, read_labels

ROOT = Path(__file__).resolve().parents[2]
MODELS = ("detector", "detector_encoded", "detector_fixed", "detector_float")
CLASSIFIERS = ("classifier", "classifier_scores", "classifier_logits")
# Output alias -> shape after the batch dimension, as written by the OD API TF2 exporter with
# max_detections 100 and 4 classes (+1 background); raw_* have R = 200 rows.
EXPECTED_OUTPUTS = {
    "detection_boxes": [100, 4],
    "detection_classes": [100],
    "detection_multiclass_scores": [100, 5],
    "detection_scores": [100],
    "num_detections": [],
    "raw_detection_boxes": [200, 4],
    "raw_detection_scores": [200, 5],
}
# Input per model: (dtype, shape) of `input_tensor`, as for the OD API input types
# image_tensor, encoded_image_string_tensor, image_tensor at a fixed size and
# float_image_tensor.
EXPECTED_INPUTS = {
    "detector": (types_pb2.DT_UINT8, [1, -1, -1, 3]),
    "detector_encoded": (types_pb2.DT_STRING, [-1]),
    "detector_fixed": (types_pb2.DT_UINT8, [1, 320, 320, 3]),
    "detector_float": (types_pb2.DT_FLOAT, [1, -1, -1, 3]),
}
BATCH = {"detector": 1, "detector_encoded": -1, "detector_fixed": 1, "detector_float": 1}
TF_DTYPES = {
    types_pb2.DT_UINT8: tf.uint8,
    types_pb2.DT_STRING: tf.string,
    types_pb2.DT_FLOAT: tf.float32,
}
# The classifiers' ViT forms: input alias -> (dtype, shape), output alias -> (dtype, shape).
CLASSIFIER_SIGNATURES = {
    "classifier": (
        {"string_input": (types_pb2.DT_STRING, [-1])},
        {"label": (types_pb2.DT_STRING, [-1]), "confidence": (types_pb2.DT_FLOAT, [-1])},
    ),
    "classifier_scores": (
        {"input_tensor": (types_pb2.DT_FLOAT, [-1, 224, 224, 3])},
        {"probabilities": (types_pb2.DT_FLOAT, [-1, 8])},
    ),
    "classifier_logits": (
        {"pixel_values": (types_pb2.DT_FLOAT, [-1, 3, 224, 224])},
        {"logits": (types_pb2.DT_FLOAT, [-1, 8])},
    ),
}


def _signature_defs(version_dir: Path) -> dict[str, meta_graph_pb2.SignatureDef]:
    saved_model = saved_model_pb2.SavedModel()
    saved_model.ParseFromString((version_dir / "saved_model.pb").read_bytes())
    (meta_graph,) = saved_model.meta_graphs
    assert list(meta_graph.meta_info_def.tags) == ["serve"]
    return dict(meta_graph.signature_def)


@pytest.mark.parametrize("name", MODELS)
def test_signature_def_is_the_od_api_one(model_repo: Path, name: str) -> None:
    signatures = _signature_defs(model_repo / name / "1")
    assert set(signatures) == {"serving_default", "__saved_model_init_op"}
    signature = signatures["serving_default"]
    assert signature.method_name == "tensorflow/serving/predict"

    inputs = signature.inputs
    assert list(inputs) == ["input_tensor"]
    dtype, shape = EXPECTED_INPUTS[name]
    assert inputs["input_tensor"].dtype == dtype
    assert [d.size for d in inputs["input_tensor"].tensor_shape.dim] == shape
    assert inputs["input_tensor"].name == "serving_default_input_tensor:0"

    outputs = signature.outputs
    assert set(outputs) == set(EXPECTED_OUTPUTS)
    for index, (alias, shape) in enumerate(sorted(EXPECTED_OUTPUTS.items())):
        info = outputs[alias]
        assert info.dtype == types_pb2.DT_FLOAT, alias
        assert [d.size for d in info.tensor_shape.dim] == [BATCH[name], *shape], alias
        # Stateful like a real model (it reads variables); outputs in alphabetical order.
        assert info.name == f"StatefulPartitionedCall:{index}", alias


@pytest.mark.parametrize("name", MODELS)
def test_loaded_signature_has_the_od_api_structure(model_repo: Path, name: str) -> None:
    loaded = tf.saved_model.load(str(model_repo / name / "1"))
    function = loaded.signatures["serving_default"]
    _, kwargs = function.structured_input_signature
    assert list(kwargs) == ["input_tensor"]
    assert kwargs["input_tensor"].dtype == TF_DTYPES[EXPECTED_INPUTS[name][0]]
    assert sorted(function.structured_outputs) == sorted(EXPECTED_OUTPUTS)
    assert all(spec.dtype == tf.float32 for spec in function.structured_outputs.values())
    assert int(loaded.model_version.numpy()) == 1


@pytest.mark.parametrize("name", MODELS + CLASSIFIERS)
def test_version_dir_layout(model_repo: Path, name: str) -> None:
    base = model_repo / name
    # The numeric version is there and the staging directory is gone.
    names = [p.name for p in base.iterdir()]
    assert "1" in names
    assert not [n for n in names if n.startswith(".export-")]
    version_dir = base / "1"
    assert (version_dir / "saved_model.pb").is_file()
    assert (version_dir / "variables" / "variables.index").is_file()
    extra = version_dir / "assets.extra"
    class_names, source = (
        ("label_map.pbtxt", export.LABEL_MAP_PATH)
        if name in MODELS
        else ("labels.txt", LABELS_PATH)
    )
    assert sorted(p.name for p in extra.iterdir()) == sorted(
        [class_names, "tf_serving_warmup_requests"]
    )
    assert (extra / class_names).read_bytes() == source.read_bytes()
    # Readable by a TF Serving process running as another user.
    assert version_dir.stat().st_mode & 0o755 == 0o755


@pytest.mark.parametrize("name", ["detector", "detector_encoded"])
def test_warmup_records_are_predict_requests_for_the_sample_scenes(
    model_repo: Path, name: str
) -> None:
    logs = warmup.read_warmup_file(
        model_repo / name / "1" / "assets.extra" / warmup.WARMUP_FILENAME
    )
    samples = warmup.sample_images()
    assert 1 <= len(logs) <= warmup.MAX_WARMUP_RECORDS
    assert len(logs) == len(samples)
    sizes = set()
    for log, (pixels, encoded) in zip(logs, samples, strict=True):
        assert log.WhichOneof("log_type") == "predict_log"
        request = log.predict_log.request
        assert request.model_spec.name == name
        assert request.model_spec.signature_name == "serving_default"
        assert list(request.inputs) == ["input_tensor"]
        tensor = request.inputs["input_tensor"]
        value = tf.make_ndarray(tensor)
        if name == "detector":
            assert tensor.dtype == types_pb2.DT_UINT8
            # Compact encoding, as a real client sends images.
            assert len(tensor.tensor_content) == pixels.size
            np.testing.assert_array_equal(value, pixels[np.newaxis])
        else:
            assert tensor.dtype == types_pb2.DT_STRING
            assert value.shape == (1,) and value[0] == encoded
            np.testing.assert_array_equal(scenes.decode(value[0]), _lossy_ok(pixels, encoded))
        sizes.add(pixels.shape)
    assert len(sizes) >= 2, "warmup should cover more than one image size"


def _lossy_ok(pixels: np.ndarray, encoded: bytes) -> np.ndarray:
    """The pixels a warmup image decodes to: exact for PNG, the JPEG round trip otherwise."""
    return pixels if encoded.startswith(b"\x89PNG") else scenes.decode(encoded)


def test_warmup_requests_run_on_the_exported_model(model_repo: Path) -> None:
    name = "detector_encoded"
    function = tf.saved_model.load(str(model_repo / name / "1")).signatures["serving_default"]
    for log in warmup.read_warmup_file(
        model_repo / name / "1" / "assets.extra" / warmup.WARMUP_FILENAME
    ):
        tensor = log.predict_log.request.inputs["input_tensor"]
        outputs = function(input_tensor=tf.constant(tf.make_ndarray(tensor)))
        assert outputs["num_detections"].numpy()[0] > 0


def _label_map_class() -> type[Message]:
    """StringIntLabelMap (object_detection/protos/string_int_label_map.proto, fields used by
    our label map) built at run time, so the official text-format parser can read the file
    without the Object Detection API installed."""
    proto = descriptor_pb2.FileDescriptorProto(
        name="string_int_label_map_for_tests.proto",
        package="object_detection.protos",
        syntax="proto2",
    )
    item = proto.message_type.add(name="StringIntLabelMapItem")
    optional = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
    item.field.add(name="name", number=1, type=9, label=optional)  # TYPE_STRING
    item.field.add(name="id", number=2, type=5, label=optional)  # TYPE_INT32
    item.field.add(name="display_name", number=3, type=9, label=optional)
    label_map = proto.message_type.add(name="StringIntLabelMap")
    label_map.field.add(
        name="item",
        number=1,
        type=11,  # TYPE_MESSAGE
        label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
        type_name=".object_detection.protos.StringIntLabelMapItem",
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("object_detection.protos.StringIntLabelMap")
    )


def test_label_map_parses_and_matches_the_palette() -> None:
    label_map: Any = _label_map_class()()  # a dynamic message class: fields unknown to mypy
    text_format.Parse(export.LABEL_MAP_PATH.read_text(), label_map)
    items = [(i.id, i.name, i.display_name) for i in label_map.item]
    assert items == [(c.class_id, c.name, c.display_name) for c in scenes.PALETTE]
    assert [i[0] for i in items] == [1, 2, 3, 4]  # 0 is the background


def test_cli_exports_version_2_and_if_missing_skips_existing(tmp_path: Path) -> None:
    export.main(["--out", str(tmp_path), "--version", "2", "--model", "detector"])
    version_dir = tmp_path / "detector" / "2"
    assert int(tf.saved_model.load(str(version_dir)).model_version.numpy()) == 2
    assert not (tmp_path / "detector_encoded").exists()
    assert sorted(p.name for p in (tmp_path / "detector").iterdir()) == ["2"]

    before = (version_dir / "saved_model.pb").stat().st_mtime_ns
    paths = export.export_models(tmp_path, version=2, names=["detector"], if_missing=True)
    assert paths == {"detector": version_dir}
    assert (version_dir / "saved_model.pb").stat().st_mtime_ns == before

    with pytest.raises(FileExistsError, match="already exists"):
        export.export_models(tmp_path, version=2, names=["detector"])
    with pytest.raises(ValueError, match="unknown model"):
        export.export_models(tmp_path, names=["resnet"])


# ----- the classifiers and the list of reference models -------------------------------------


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_classifier_signature_def_is_the_vit_one(model_repo: Path, name: str) -> None:
    signatures = _signature_defs(model_repo / name / "1")
    assert set(signatures) == {"serving_default", "__saved_model_init_op"}
    signature = signatures["serving_default"]
    assert signature.method_name == "tensorflow/serving/predict"
    inputs, outputs = CLASSIFIER_SIGNATURES[name]
    assert {
        alias: (info.dtype, [d.size for d in info.tensor_shape.dim])
        for alias, info in signature.inputs.items()
    } == inputs
    assert {
        alias: (info.dtype, [d.size for d in info.tensor_shape.dim])
        for alias, info in signature.outputs.items()
    } == outputs
    (alias,) = inputs
    assert signature.inputs[alias].name == f"serving_default_{alias}:0"
    # Stateful like a real ViT (it reads variables); outputs in alphabetical order.
    for index, alias in enumerate(sorted(outputs)):
        assert signature.outputs[alias].name == f"StatefulPartitionedCall:{index}"


def test_labels_are_the_palette_in_class_id_order() -> None:
    expected = ["red", "green", "blue", "yellow", "cyan", "magenta", "white", "black"]
    assert LABELS_PATH.read_text() == "".join(f"{label}\n" for label in expected)
    assert read_labels() == expected == list(CLASSIFIER_PALETTE)
    assert CLASSIFIER_PALETTE["yellow"] == (255, 255, 0)
    assert all(set(rgb) <= {0, 255} for rgb in CLASSIFIER_PALETTE.values())
    assert len(set(CLASSIFIER_PALETTE.values())) == 8  # the eight corners of the RGB cube


def test_the_cluster_copy_of_labels_txt_is_identical() -> None:
    assert (ROOT / "k8s" / "base" / "config" / "labels.txt").read_bytes() == (
        LABELS_PATH.read_bytes()
    )


def test_every_reference_model_is_exported_and_served_by_the_configs() -> None:
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    assert list(export.MODELS) == list(REFERENCE_MODELS)
    assert export.REFERENCE_MODELS is REFERENCE_MODELS
    assert {n for n, task in REFERENCE_MODELS.items() if task == "detection"} == set(MODELS)
    assert {n for n, task in REFERENCE_MODELS.items() if task == "classification"} == set(
        CLASSIFIERS
    )
    config = text_format.Parse(
        (ROOT / "serving" / "models.config").read_text(),
        model_server_config_pb2.ModelServerConfig(),
    )
    assert [m.name for m in config.model_config_list.config] == list(REFERENCE_MODELS)
    for model in config.model_config_list.config:
        assert model.base_path == f"models/{model.name}"
        assert model.model_version_policy.latest.num_versions == 2
        assert dict(model.version_labels) == {"stable": 1, "canary": 1}


# Input alias per model, and how many records its warmup file holds (one per sample image).
WARMUP_INPUTS = {
    "detector": ("input_tensor", types_pb2.DT_UINT8, len(warmup.sample_images())),
    "detector_encoded": ("input_tensor", types_pb2.DT_STRING, len(warmup.sample_images())),
    "detector_fixed": ("input_tensor", types_pb2.DT_UINT8, len(warmup.fixed_size_samples())),
    "detector_float": ("input_tensor", types_pb2.DT_FLOAT, len(warmup.sample_images())),
    "classifier": ("string_input", types_pb2.DT_STRING, len(warmup.classifier_samples())),
    "classifier_scores": ("input_tensor", types_pb2.DT_FLOAT, len(warmup.classifier_samples())),
    "classifier_logits": ("pixel_values", types_pb2.DT_FLOAT, len(warmup.classifier_samples())),
    "maskrcnn": ("input_tensor", types_pb2.DT_UINT8, len(warmup.sample_images())),
    "pose": ("images", types_pb2.DT_FLOAT, len(warmup.pose_samples())),
    "embedder": ("inputs", types_pb2.DT_FLOAT, len(warmup.classifier_samples())),
}


@pytest.mark.parametrize("name", sorted(WARMUP_INPUTS))
def test_warmup_requests_run_on_every_exported_model(model_repo: Path, name: str) -> None:
    """Each record is a Predict request in the model's own input form, and the SavedModel
    answers it (TF Serving fails the load of a version whose warmup fails)."""
    alias, dtype, count = WARMUP_INPUTS[name]
    logs = warmup.read_warmup_file(
        model_repo / name / "1" / "assets.extra" / warmup.WARMUP_FILENAME
    )
    assert len(logs) == count >= 2
    function = tf.saved_model.load(str(model_repo / name / "1")).signatures["serving_default"]
    for log in logs:
        request = log.predict_log.request
        assert (request.model_spec.name, request.model_spec.signature_name) == (
            name,
            "serving_default",
        )
        assert list(request.inputs) == [alias]
        assert request.inputs[alias].dtype == dtype
        outputs = function(**{alias: tf.constant(tf.make_ndarray(request.inputs[alias]))})
        if name in (*MODELS, "maskrcnn"):
            assert outputs["num_detections"].numpy()[0] > 0
        elif name == "pose":
            assert (outputs["output_0"].numpy()[0, 4] > 0).any()  # a person scores
        elif name == "embedder":
            assert outputs["output_0"].shape == (1, 48)
        elif name == "classifier":
            assert outputs["label"].numpy()[0].decode() in CLASSIFIER_PALETTE
        else:
            scores = outputs.get("probabilities", outputs.get("logits"))
            assert scores is not None and scores.shape == (1, 8)


def test_the_list_of_reference_models_imports_without_tensorflow() -> None:
    """The gateway's dev launcher reads it; importing TensorFlow there would cost seconds."""
    import subprocess
    import sys

    code = (
        "import sys; from serving.reference import REFERENCE_MODELS, read_labels; "
        "assert 'tensorflow' not in sys.modules and 'numpy' not in sys.modules; "
        "print(len(REFERENCE_MODELS), len(read_labels()))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["10", "8"]
