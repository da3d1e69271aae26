"""Rollouts (`[models.NAME.rollout]`, gateway.models.rollout): which version of a model a
request gets, and whether a copy of it goes to a shadow candidate (gateway.policy.shadow).

Only a request that names neither a version nor a label takes part; one that names either is
never rerouted. Of the others, `weight` percent go to the canary, the rest to `current` (the
latest version without it): decided by a stable hash of the request id or the caller with
`sticky` (so one key always lands on one side), at random otherwise. The hash is keyed with a
secret salt (GATEWAY_ROLLOUT_SALT, the same on every replica; without it a random one per
process), so no caller can work out offline which request ids land on which side, nor carry
what it learnt to another deployment. Of the requests served by the current side, a `share`
is copied to the shadow candidate once answered.

Metrics per model and candidate (both from the model config, so the file bounds the series);
the same counts, per process, make the summary (`GET /v1/models/{name}/rollout`).
"""

from __future__ import annotations

import hashlib
import random
import secrets
from collections.abc import Iterator
from typing import Any

from prometheus_client import Counter, Summary

from gateway.domain import Comparison, ModelRef
from gateway.models import ModelRegistry
from gateway.models.rollout import RolloutConfig, Target

ROUTED = Counter(
    "vision_gateway_rollout_requests",
    "Requests of a model with a rollout, by the side they were routed to: canary (the "
    "candidate named by its canary) or current (the rest); counted when routed, whatever "
    "the answer.",
    ["model", "candidate", "side"],
)
SHADOW_CALLS = Counter(
    "vision_gateway_shadow_calls",
    "Copies of requests for a model's shadow candidate: sent, failed (the candidate gave no "
    "answer), or dropped (too many pending, or the gateway near its concurrency limit).",
    ["model", "candidate", "outcome"],
)
MEASURE = Summary(
    "vision_gateway_shadow_measure",
    "Per compared image: a measure of the shadow candidate's answer against the current "
    "model's, by task and measure (Task.compare: detection precision and recall, "
    "classification top1_agreement and topk_overlap, segmentation mask_iou, keypoints "
    "keypoint_similarity, embedding cosine_similarity, ...). Mean = _sum / _count.",
    ["model", "candidate", "task", "measure"],
)
PAIR_DELTA = Summary(
    "vision_gateway_shadow_score_delta",
    "Per matched instance pair, by task: the candidate's score minus the current model's.",
    ["model", "candidate", "task"],
)
# The metrics named before comparisons were the task's, kept beside MEASURE and PAIR_DELTA
# for dashboards: vision_gateway_shadow_<task>_<measure>, detection's score deltas as its
# score_delta.
_NAMED = {
    (task, measure): Summary(f"vision_gateway_shadow_{task}_{measure}", text,
                             ["model", "candidate"])
    for task, measure, text in (
        ("detection", "precision",
         "Per compared image: the share of the shadow candidate's boxes that match one of the "
         "current model's (same label, IoU >= 0.5). Mean = _sum / _count."),
        ("detection", "recall",
         "Per compared image: the share of the current model's boxes the shadow candidate "
         "matched."),
        ("detection", "score_delta",
         "Per matched box pair: the candidate's score minus the current model's."),
        ("classification", "top1_agreement",
         "Per compared image: 1 when the shadow candidate's top class is the current model's, "
         "else 0."),
        ("classification", "topk_overlap",
         "Per compared image: the classes both top-k lists name, over the longer list's length."),
    )
}  # fmt: skip
# Measures the summary always shows for these tasks (None until an image is compared).
_SHOWN = {"detection": ("precision", "recall"),
          "classification": ("top1_agreement", "topk_overlap")}  # fmt: skip
_SLOTS = 10_000  # a weight's resolution: 1/100 of a percent


def _ref(name: str, target: Target) -> ModelRef:
    return ModelRef(name, target.version, target.label)


def _label(target: Target | None) -> str:
    if target is None:
        return ""
    return f"version:{target.version}" if target.version is not None else f"label:{target.label}"


def _slot(salt: bytes, model: str, key: str) -> int:
    digest = hashlib.blake2b(f"{model}\0{key}".encode(), digest_size=8, key=salt).digest()
    return int.from_bytes(digest, "big") % _SLOTS


def salt_of(secret: str) -> bytes:
    """The hash key from GATEWAY_ROLLOUT_SALT (any length); a random one when it is empty."""
    if not secret:
        return secrets.token_bytes(32)
    return hashlib.sha256(secret.encode()).digest()


class ModelRollout:
    """One model's rollout: its config, where its requests go, and what was counted."""

    def __init__(self, name: str, config: RolloutConfig, salt: bytes = b"") -> None:
        self.name = name
        self.config = config
        self._salt = salt or salt_of("")
        self.current = _ref(name, config.current) if config.current else ModelRef(name)
        self.canary = _ref(name, config.canary) if config.canary else None
        self.shadow = _ref(name, config.shadow) if config.shadow else None
        self._canary_slots = round(config.weight * _SLOTS / 100)
        canary, shadow = _label(config.canary), _label(config.shadow)
        self._served = {
            True: ROUTED.labels(name, canary, "canary"),
            False: ROUTED.labels(name, canary, "current"),
        }
        self._calls = {
            outcome: SHADOW_CALLS.labels(name, shadow, outcome)
            for outcome in ("sent", "failed", "dropped")
        }
        self._shadow_label = shadow
        self._observers: dict[tuple[str, str], list[Any]] = {}
        # This process's counts, for the summary.
        self.counts = {"current": 0, "canary": 0, "sent": 0, "failed": 0, "dropped": 0}
        # Per task: images compared, matched pairs and their score deltas' sum, and per
        # measure its sum over the images.
        self.compared: dict[str, dict[str, float]] = {}

    def to_canary(self, caller: str, request_id: str) -> bool:
        if self.canary is None:
            return False
        sticky = self.config.sticky
        if sticky is None:
            return random.randrange(_SLOTS) < self._canary_slots
        key = caller if sticky == "caller" else request_id
        return _slot(self._salt, self.name, key) < self._canary_slots

    def served(self, canary: bool) -> None:
        self.counts["canary" if canary else "current"] += 1
        self._served[canary].inc()

    def shadow_call(self, outcome: str) -> None:
        """Counts a shadow call: sent, failed or dropped."""
        self.counts[outcome] += 1
        self._calls[outcome].inc()

    def record(self, comparison: Comparison) -> None:
        """Counts one compared image, whatever its task (gateway.domain.Comparison)."""
        task = comparison.task
        sums = self.compared.setdefault(task, {"images": 0.0, "pairs": 0.0, "deltas": 0.0})
        sums["images"] += 1
        for measure, value in comparison.measures.items():
            sums[measure] = sums.get(measure, 0.0) + value
            for metric in self._metrics(task, measure):
                metric.observe(value)
        if comparison.score_deltas:
            sums["pairs"] += len(comparison.score_deltas)
            sums["deltas"] += sum(comparison.score_deltas)
            metrics = self._metrics(task, "")
            for value in comparison.score_deltas:
                for metric in metrics:
                    metric.observe(value)

    def _metrics(self, task: str, measure: str) -> list[Any]:
        """The summaries a measure ("" for score deltas) is observed in, made once."""
        found = self._observers.get((task, measure))
        if found is None:
            name, shadow = self.name, self._shadow_label
            if measure:
                found = [MEASURE.labels(name, shadow, task, measure)]
            else:
                found = [PAIR_DELTA.labels(name, shadow, task)]
            named = _NAMED.get((task, measure or "score_delta"))
            if named is not None:
                found.append(named.labels(name, shadow))
            self._observers[(task, measure)] = found
        return found

    def describe(self) -> dict[str, Any]:
        """The rollout as configured (check-models and the summary show it)."""
        config = self.config
        out: dict[str, Any] = {
            "model": self.name,
            "current": config.current.describe() if config.current else "latest version",
        }
        if config.canary is not None:
            out["canary"] = {"candidate": config.canary.describe(), "weight": config.weight,
                             "sticky": config.sticky or "random"}  # fmt: skip
        if config.shadow is not None:
            out["shadow"] = {"candidate": config.shadow.describe(), "share": config.share}
        return out

    def summary(self) -> dict[str, Any]:
        """What this process counted: requests per side, shadow calls and their comparison,
        per task: images compared, the mean of each measure, matched pairs and their mean
        score delta."""
        out = self.describe()
        counts = self.counts
        if "canary" in out:
            out["canary"]["served"] = {"canary": counts["canary"], "current": counts["current"]}
        if "shadow" in out:
            out["shadow"]["calls"] = {k: counts[k] for k in ("sent", "failed", "dropped")}
            for task in {**dict.fromkeys(_SHOWN), **dict.fromkeys(self.compared)}:
                out["shadow"][task] = self._task_summary(task)
        return out

    def _task_summary(self, task: str) -> dict[str, Any]:
        sums = self.compared.get(task, {})
        images = int(sums.get("images", 0))
        measures = [m for m in sums if m not in ("images", "pairs", "deltas")]
        shown: dict[str, Any] = {"images": images}
        for measure in dict.fromkeys((*_SHOWN.get(task, ()), *measures)):
            total = sums.get(measure)
            shown[measure] = round(total / images, 6) if images and total is not None else None
        if "precision" in shown:  # tasks that match instances
            pairs = int(sums.get("pairs", 0))
            shown["matched_pairs"] = pairs
            shown["mean_score_delta"] = round(sums["deltas"] / pairs, 6) if pairs else None
        return shown


class Rollouts:
    """Every model's rollout; `route` is asked once per request."""

    def __init__(self, registry: ModelRegistry, salt: str = "") -> None:
        key = salt_of(salt)
        self.models = {
            name: ModelRollout(name, config.rollout, key)
            for name, config in registry.models.items()
            if config.rollout is not None
        }

    def __iter__(self) -> Iterator[ModelRollout]:
        return iter(self.models.values())

    def summary(self, model: str) -> dict[str, Any] | None:
        """`model`'s rollout statistics (ModelRollout.summary); None when it has none."""
        rollout = self.models.get(model)
        return None if rollout is None else rollout.summary()

    def route(
        self, model: ModelRef, caller: str, request_id: str
    ) -> tuple[ModelRef, ModelRollout | None]:
        """The model to call for a request for `model`, and the rollout to copy the request
        to its shadow candidate once answered (None: no copy)."""
        if not self.models or model.version is not None or model.label is not None:
            return model, None
        rollout = self.models.get(model.name)
        if rollout is None:
            return model, None
        canary = rollout.to_canary(caller, request_id)
        rollout.served(canary)
        if canary:
            assert rollout.canary is not None
            return rollout.canary, None
        shadow = rollout.shadow is not None and random.random() < rollout.config.share
        return rollout.current, rollout if shadow else None
