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

from gateway.domain import ModelRef
from gateway.models import ModelRegistry
from gateway.models.rollout import RolloutConfig, Target
from gateway.policy.compare import ClassificationComparison, Comparison, DetectionComparison

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
PRECISION = Summary(
    "vision_gateway_shadow_detection_precision",
    "Per compared image: the share of the shadow candidate's boxes that match one of the "
    "current model's (same label, IoU >= 0.5). Mean = _sum / _count.",
    ["model", "candidate"],
)
RECALL = Summary(
    "vision_gateway_shadow_detection_recall",
    "Per compared image: the share of the current model's boxes the shadow candidate matched.",
    ["model", "candidate"],
)
SCORE_DELTA = Summary(
    "vision_gateway_shadow_detection_score_delta",
    "Per matched box pair: the candidate's score minus the current model's.",
    ["model", "candidate"],
)
TOP1 = Summary(
    "vision_gateway_shadow_classification_top1_agreement",
    "Per compared image: 1 when the shadow candidate's top class is the current model's, else 0.",
    ["model", "candidate"],
)
TOPK = Summary(
    "vision_gateway_shadow_classification_topk_overlap",
    "Per compared image: the classes both top-k lists name, over the longer list's length.",
    ["model", "candidate"],
)
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
        self._metrics = (
            PRECISION.labels(name, shadow),
            RECALL.labels(name, shadow),
            SCORE_DELTA.labels(name, shadow),
            TOP1.labels(name, shadow),
            TOPK.labels(name, shadow),
        )
        # This process's counts, for the summary.
        self.counts = {"current": 0, "canary": 0, "sent": 0, "failed": 0, "dropped": 0}
        self.sums = {"precision": 0.0, "recall": 0.0, "score_delta": 0.0, "top1": 0.0,
                     "topk": 0.0}  # fmt: skip
        self.compared = {"detection": 0, "pairs": 0, "classification": 0}

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
        precision, recall, delta, top1, topk = self._metrics
        if isinstance(comparison, DetectionComparison):
            self.compared["detection"] += 1
            self.sums["precision"] += comparison.precision
            self.sums["recall"] += comparison.recall
            precision.observe(comparison.precision)
            recall.observe(comparison.recall)
            for value in comparison.score_deltas:
                self.compared["pairs"] += 1
                self.sums["score_delta"] += value
                delta.observe(value)
        elif isinstance(comparison, ClassificationComparison):
            self.compared["classification"] += 1
            agrees = 1.0 if comparison.top1_agrees else 0.0
            self.sums["top1"] += agrees
            self.sums["topk"] += comparison.topk_overlap
            top1.observe(agrees)
            topk.observe(comparison.topk_overlap)

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
        """What this process counted: requests per side, shadow calls and their comparison."""

        def mean(total: str, count: str) -> float | None:
            n = self.compared[count]
            return round(self.sums[total] / n, 6) if n else None

        out = self.describe()
        counts = self.counts
        if "canary" in out:
            out["canary"]["served"] = {"canary": counts["canary"], "current": counts["current"]}
        if "shadow" in out:
            out["shadow"]["calls"] = {k: counts[k] for k in ("sent", "failed", "dropped")}
            out["shadow"]["detection"] = {
                "images": self.compared["detection"],
                "precision": mean("precision", "detection"),
                "recall": mean("recall", "detection"),
                "matched_pairs": self.compared["pairs"],
                "mean_score_delta": mean("score_delta", "pairs"),
            }
            out["shadow"]["classification"] = {
                "images": self.compared["classification"],
                "top1_agreement": mean("top1", "classification"),
                "topk_overlap": mean("topk", "classification"),
            }
        return out


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
