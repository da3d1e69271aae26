"""Exports the reference models (serving.reference.REFERENCE_MODELS) as TF Serving versions.

For each model: <out>/<name>/<version>/ holds the SavedModel (signature `serving_default`)
plus assets.extra/tf_serving_warmup_requests and the class names: label_map.pbtxt (OD API
label map) for the detectors and the segmenter, labels.txt (one class per line, line i =
class id i) for the classifiers and the keypoint model, none for the embedder. The detectors
have the OD API TF2 exporter's inputs and outputs, the classifiers those of a Hugging Face ViT
exported for TF Serving (serving.detector, serving.classifier); the segmenter an OD API Mask
R-CNN's, the keypoint model a YOLOv8-pose TF export's, the embedder a headless Keras
application's (serving.segmenter, serving.pose, serving.embedder).

CLI: python -m serving.export --out models [--version N] [--model detector ...] [--if-missing]
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from serving.reference import LABELS_FILENAME, LABELS_PATH, POSE_LABELS_PATH, REFERENCE_MODELS

__all__ = ["MODELS", "REFERENCE_MODELS", "export_model", "export_models"]

LABEL_MAP_PATH = Path(__file__).with_name("label_map.pbtxt")
ASSETS_EXTRA = "assets.extra"
LABEL_MAP_FILENAME = "label_map.pbtxt"
# The class-name file each task ships in assets.extra/: (source, file name); an embedder
# has no classes.
_CLASS_NAMES = {
    "detection": (LABEL_MAP_PATH, LABEL_MAP_FILENAME),
    "classification": (LABELS_PATH, LABELS_FILENAME),
    "instance_segmentation": (LABEL_MAP_PATH, LABEL_MAP_FILENAME),
    "keypoints": (POSE_LABELS_PATH, LABELS_FILENAME),
}

# Model name -> the tf.Module class that builds it from its version ("module:class"), the same
# names as REFERENCE_MODELS. Imported when a model is exported: `--if-missing` with every
# model in place (`make run` after the first) needs no TensorFlow and returns at once.
MODELS: dict[str, str] = {
    "detector": "serving.detector:ImageTensorDetector",
    "detector_encoded": "serving.detector:EncodedImageDetector",
    "detector_fixed": "serving.detector:FixedSizeDetector",
    "detector_float": "serving.detector:FloatImageDetector",
    "classifier": "serving.classifier:EncodedImageClassifier",
    "classifier_scores": "serving.classifier:ScoresClassifier",
    "classifier_logits": "serving.classifier:LogitsClassifier",
    "maskrcnn": "serving.segmenter:InstanceSegmenter",
    "pose": "serving.pose:PoseModel",
    "embedder": "serving.embedder:Embedder",
}


def export_model(out_dir: Path, name: str, version: int = 1) -> Path:
    """Exports model `name` as <out_dir>/<name>/<version>/ and returns that directory.

    The version is written to a temporary sibling and renamed into place at the end, so a
    TF Serving instance polling the base path never sees a half-written version (it ignores
    non-numeric directory names), and an interrupted export leaves no version behind.
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(MODELS)}")
    if version < 1:
        raise ValueError(f"version must be a positive integer, got {version}")
    import tensorflow as tf

    from serving import warmup

    module_name, class_name = MODELS[name].split(":")
    factory = getattr(importlib.import_module(module_name), class_name)
    class_names = _CLASS_NAMES.get(REFERENCE_MODELS[name])
    base = out_dir / name
    base.mkdir(parents=True, exist_ok=True)
    version_dir = base / str(version)
    if version_dir.exists():
        raise FileExistsError(f"{version_dir} already exists; remove it or pick another version")

    staging = Path(tempfile.mkdtemp(prefix=f".export-{version}-", dir=base))
    # mkdtemp creates 0700; TF Serving may run as another user (e.g. in a container).
    staging.chmod(0o755)
    try:
        module = factory(version)
        signature = module.__call__.get_concrete_function()
        tf.saved_model.save(module, str(staging), signatures={"serving_default": signature})
        extra = staging / ASSETS_EXTRA
        extra.mkdir(exist_ok=True)
        if class_names is not None:
            shutil.copyfile(class_names[0], extra / class_names[1])
        warmup.write_warmup_file(extra / warmup.WARMUP_FILENAME, warmup.warmup_requests(name))
        staging.rename(version_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return version_dir


def export_models(
    out_dir: Path,
    version: int = 1,
    names: Sequence[str] = tuple(REFERENCE_MODELS),
    if_missing: bool = False,
) -> dict[str, Path]:
    """Exports each named model (default: all) as <out_dir>/<name>/<version>/; returns the
    version dirs.

    With `if_missing`, a model whose version directory already exists is left untouched.
    """
    result = {}
    for name in names:
        version_dir = Path(out_dir) / name / str(version)
        if if_missing and version_dir.exists():
            result[name] = version_dir
            continue
        result[name] = export_model(Path(out_dir), name, version)
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m serving.export",
        description="Export the reference SavedModels (all five tasks) for TF Serving.",
    )
    parser.add_argument("--out", type=Path, required=True, help="model repository root")
    parser.add_argument("--version", type=int, default=1, help="version number (default 1)")
    parser.add_argument(
        "--model",
        action="append",
        choices=sorted(MODELS),
        help="model to export; repeat for several (default: all)",
    )
    parser.add_argument(
        "--if-missing",
        action="store_true",
        help="skip models whose version directory already exists",
    )
    args = parser.parse_args(argv)
    names = args.model or list(MODELS)
    for name, path in export_models(args.out, args.version, names, args.if_missing).items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
