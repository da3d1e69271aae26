"""The configured models: each one's config (ModelConfig: task, labels, input preparation,
signature, batching, rollout, and the task's own config), the default model and the default
model of each task, and the pipelines of them; ModelRegistry gives a request's model its config."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.config import Settings
from gateway.labels import Labels
from gateway.models.batching import BatchingConfig
from gateway.models.input_prep import InputPrep
from gateway.models.limits import LimitsConfig, Rules, rules
from gateway.models.pipelines import PipelineConfig
from gateway.models.rollout import RolloutConfig

DEFAULT_SIGNATURE = "serving_default"


@dataclass(frozen=True)
class ModelConfig:
    name: str
    task: str
    labels: Labels = field(default_factory=Labels)
    input: InputPrep = field(default_factory=InputPrep)
    signature: str = DEFAULT_SIGNATURE  # the signature to call (model_spec.signature_name)
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    rollout: RolloutConfig | None = None  # a canary or shadow version (gateway.policy.rollout)
    # Ceilings on one request's work ([models.NAME.limits]); unset: the gateway's.
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    # The task's own config (its request defaults, its [outputs]), as the task's read_config
    # made it; None: the task's defaults (a model the config file does not list).
    task_config: Any = None

    def rules(self, settings: Settings) -> Rules:
        """What the operator sets for this model's requests (its ceilings, the gateway's
        request defaults): what a task's resolve reads."""
        return rules(self.limits, self.name, settings)


_MAX_UNLISTED = 1024


@dataclass(frozen=True)
class ModelRegistry:
    """Every configured model, the default model, the default model of each task, and the
    task of a model the config does not list (the task registry's default)."""

    models: Mapping[str, ModelConfig]
    default_model: str
    task_defaults: Mapping[str, str]
    default_task: str
    # Cascades of these models ([pipelines.NAME]), by name.
    pipelines: Mapping[str, PipelineConfig] = field(default_factory=dict)
    # Configs made for unlisted models, kept (bounded: callers choose the names) so that a
    # request for one does not build its config again.
    _unlisted: dict[tuple[str, str], ModelConfig] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def get(self, name: str, task: str) -> ModelConfig:
        """The config of `name` for `task`; an unlisted model gets the task's defaults."""
        config = self.models.get(name)
        if config is None:
            config = self._unlisted.get((name, task))
            if config is None:
                if len(self._unlisted) >= _MAX_UNLISTED:
                    self._unlisted.clear()
                config = self._unlisted[(name, task)] = ModelConfig(name=name, task=task)
        return config

    def task_of(self, name: str) -> str:
        """The task of model `name`: its config's; the default task for a model the config
        does not list (as without a config file)."""
        config = self.models.get(name)
        return config.task if config is not None else self.default_task

    def default_for(self, task: str) -> str | None:
        return self.task_defaults.get(task)

    def signature_names(self) -> dict[str, str]:
        """Models called with a signature other than serving_default, and its name."""
        return {
            name: config.signature
            for name, config in self.models.items()
            if config.signature != DEFAULT_SIGNATURE
        }


def default_registry(
    default_model: str, label_maps: Mapping[str, Labels] | None = None, *, default_task: str
) -> ModelRegistry:
    """Without a file every model has `default_task` (the task registry's first task)."""
    models = {
        name: ModelConfig(name=name, task=default_task, labels=labels)
        for name, labels in (label_maps or {}).items()
    }
    return ModelRegistry(models, default_model, {default_task: default_model}, default_task)
