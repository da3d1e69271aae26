"""The per-model configuration: what a signature does not say about a model.

- `file`: the model config file (`--model-config FILE`, TOML; its format is described
  there) read into a registry, unknown keys and impossible combinations refused naming the key;
- `registry`: each model's config and the default model of each task (ModelRegistry);
- `input_prep`: `[models.NAME.input]`, the preparation of images the graph does not do;
- `output_mapping`: `[models.NAME.outputs]`, which signature output is what;
- `values`: ModelConfigError, the built-in task names, reading one value of the file.
"""

from gateway.models.file import load_registry, parse_registry
from gateway.models.input_prep import InputPrep
from gateway.models.output_mapping import OutputMapping
from gateway.models.registry import (
    DEFAULT_SIGNATURE,
    DEFAULT_TOP_K,
    ModelConfig,
    ModelRegistry,
    default_registry,
)
from gateway.models.values import CLASSIFICATION, DETECTION, ModelConfigError

__all__ = [
    "CLASSIFICATION",
    "DEFAULT_SIGNATURE",
    "DEFAULT_TOP_K",
    "DETECTION",
    "InputPrep",
    "ModelConfig",
    "ModelConfigError",
    "ModelRegistry",
    "OutputMapping",
    "default_registry",
    "load_registry",
    "parse_registry",
]
