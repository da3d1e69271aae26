"""`[models.NAME.limits]`: ceilings on one request's work for a model, which a caller cannot
raise (gateway.domain.Cost prices the work against them before it runs).

    [models.segmenter.limits]
    max_detections = 100         # instances a request may ask for; more is refused
    max_mask_pixels = 4000000    # mask pixels one answer may paste; instances past it are cut
    max_answer_bytes = 1048576   # bytes of masks one answer may hold; instances past it are cut

A key left out is the gateway's (--max-detections-limit, --max-mask-pixels,
--max-answer-bytes: gateway.config.Settings), which the Limits of a model resolve to.

A task reads no more of the gateway's configuration than `Rules`: a model's Limits and the
operator's values of the request defaults tasks declare (`RequestDefault`: --min-score,
--max-detections).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from gateway.config import Settings
from gateway.models.values import read_integer, refuse_unknown

KEYS = ("max_detections", "max_mask_pixels", "max_answer_bytes")
# Where each ceiling's gateway-wide default is set, for messages.
FLAGS = {
    "max_detections": "GATEWAY_MAX_DETECTIONS_LIMIT",
    "max_mask_pixels": "GATEWAY_MAX_MASK_PIXELS",
    "max_answer_bytes": "GATEWAY_MAX_ANSWER_BYTES",
}


@dataclass(frozen=True)
class LimitsConfig:
    """The model's own ceilings; None: the gateway's."""

    max_detections: int | None = None
    max_mask_pixels: int | None = None
    max_answer_bytes: int | None = None


class Limits(NamedTuple):
    """A model's ceilings, resolved against the gateway's, with where each one is set (for a
    message that names the setting to change)."""

    max_detections: int
    max_mask_pixels: int
    max_answer_bytes: int
    model: str = ""
    own: frozenset[str] = frozenset()  # the keys the model's config sets

    def setting(self, key: str) -> str:
        """Where `key` is set for this model, as a person would change it."""
        if key in self.own:
            return f"models.{self.model}.limits.{key} in the model config"
        return f"{FLAGS[key]} (or models.{self.model}.limits.{key} in the model config)"


def read_limits(table: Mapping[str, Any], path: Path, where: str) -> LimitsConfig:
    """The `[limits]` table at `where` (models.NAME.limits) of the file at `path`."""
    refuse_unknown(table, set(KEYS), str(path), where + ".")
    return LimitsConfig(*(read_integer(table, key, path, where) for key in KEYS))


def resolve(
    config: LimitsConfig, model: str, max_detections: int, max_mask_pixels: int,
    max_answer_bytes: int,
) -> Limits:  # fmt: skip
    """The model's ceilings: its own where set, else the gateway's."""
    own = frozenset(key for key in KEYS if getattr(config, key) is not None)
    return Limits(
        config.max_detections or max_detections,
        config.max_mask_pixels or max_mask_pixels,
        config.max_answer_bytes or max_answer_bytes,
        model,
        own,
    )


class RequestDefault(NamedTuple):
    """A gateway-wide default a task declares (gateway.api.task.Task.request_defaults), for
    what neither a request nor the model's config sets: the operator sets it with
    --NAME-IN-DASHES or GATEWAY_NAME (gateway.flags), within [minimum, maximum]."""

    name: str  # "min_score": --min-score, GATEWAY_MIN_SCORE
    default: float | int  # its type is the flag's
    help: str
    minimum: float | int
    maximum: float | int | None = None

    def check(self, value: float | int) -> None:
        """ValueError naming the flag when `value` is out of its range."""
        flag = self.name.replace("_", "-")
        if self.maximum is not None and not self.minimum <= value <= self.maximum:
            raise ValueError(f"{flag} must be in [{self.minimum}, {self.maximum}], got {value}")
        if value < self.minimum:
            raise ValueError(f"{flag} must be at least {self.minimum}, got {value}")


class Rules(NamedTuple):
    """What the operator sets for one model's requests, all a task's `resolve` reads of the
    gateway's configuration: the model's ceilings, and the values the operator gave the
    tasks' request defaults (Settings.request_defaults)."""

    limits: Limits
    defaults: Mapping[str, float | int]

    def default(self, declared: RequestDefault) -> float | int:
        """The operator's value of a task's request default, else its declared default."""
        return self.defaults.get(declared.name, declared.default)


def rules(config: LimitsConfig, model: str, settings: Settings) -> Rules:
    """The rules for requests to `model` (its [models.NAME.limits] is `config`)."""
    limits = resolve(
        config, model, settings.max_detections_limit, settings.max_mask_pixels,
        settings.max_answer_bytes,
    )  # fmt: skip
    return Rules(limits, settings.request_defaults)
