"""Which version a request gets: the version-label map and the version a ModelSpec names.

Ports of ServerCore::UpdateModelVersionLabelMap (a label may name only an AVAILABLE version,
unless --allow_version_labels_for_unavailable_models, and then only for a new label or the
version it already names) and of the version choice in ServerCore::GetServableHandle (the
newest loaded version, a version number, or a label), with TF Serving's error texts.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from tensorflow_serving.apis import model_pb2
from tensorflow_serving.config.model_server_config_pb2 import ModelConfig

from serving.local.errors import failed_precondition, invalid_argument, not_found

Labels = dict[str, dict[str, int]]  # model name -> label -> version


def label_map(
    configs: list[ModelConfig],
    current: Labels,
    available: Callable[[str, int], bool],
    allow_unavailable: bool,
) -> Labels:
    """The labels of `configs`; `current` is the map in force, `available(name, version)`
    says whether a version is AVAILABLE now."""
    labels: Labels = {}
    for config in configs:
        for label, version in config.version_labels.items():
            existing = current.get(config.name, {}).get(label)
            allowed = allow_unavailable and (existing is None or existing == version)
            if not allowed and not available(config.name, version):
                raise failed_precondition(
                    f"Request to assign label to version {version} of model "
                    f"{config.name}, which is not currently available for inference"
                )
            labels.setdefault(config.name, {})[label] = version
    return labels


def chosen_version(spec: model_pb2.ModelSpec, loaded: Collection[int], labels: Labels) -> int:
    """The version of `loaded` (the model's loaded versions) that `spec` names."""
    choice = spec.WhichOneof("version_choice")
    if choice is None:
        if not loaded:
            raise not_found(f"Servable not found for request: Latest({spec.name})")
        return max(loaded)
    if choice == "version_label":
        version = labels.get(spec.name, {}).get(spec.version_label)
        if version is None:
            raise invalid_argument(f"Unrecognized servable version label: {spec.version_label}")
    else:
        version = spec.version.value
    if version not in loaded:
        raise not_found(f"Servable not found for request: Specific({spec.name}, {version})")
    return version
