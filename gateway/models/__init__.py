"""The per-model configuration: what a signature does not say about a model.

- `file`: the model config file (`--model-config FILE`, TOML; its format is described
  there) read into a registry, unknown keys and impossible combinations refused naming the key;
- `registry`: each model's config and the default model of each task (ModelRegistry);
- `input_prep`: `[models.NAME.input]`, the preparation of images the graph does not do;
- `values`: ModelConfigError, the keys every model shares, reading one value of the file.

A task's own keys (its request defaults, `[models.NAME.outputs]`) are read by the task
(gateway/tasks/<task>/config.py), given to `load_registry` as `tasks`.
"""

from gateway.models.file import load_registry, parse_registry
from gateway.models.input_prep import InputPrep
from gateway.models.registry import (
    DEFAULT_SIGNATURE,
    ModelConfig,
    ModelRegistry,
    default_registry,
)
from gateway.models.values import ModelConfigError

__all__ = [
    "DEFAULT_SIGNATURE",
    "InputPrep",
    "ModelConfig",
    "ModelConfigError",
    "ModelRegistry",
    "default_registry",
    "load_registry",
    "parse_registry",
]
