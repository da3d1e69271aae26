"""Routing of a model's requests by its rollout: canary weight, stickiness, explicit versions
never rerouted, shadow share; and the summary's counts."""

from __future__ import annotations

import hashlib

from gateway.domain import Comparison, ModelRef
from gateway.models import ModelConfig, ModelRegistry
from gateway.models.rollout import RolloutConfig, Target
from gateway.policy.rollout import Rollouts


def rollouts(name: str = "m", **rollout: object) -> Rollouts:
    config = ModelConfig(name, "detection", rollout=RolloutConfig(**rollout))  # type: ignore[arg-type]
    plain = ModelConfig("plain", "detection")
    return Rollouts(ModelRegistry({name: config, "plain": plain}, name, {}, "detection"))


def test_explicit_versions_labels_and_other_models_are_never_rerouted():
    routes = rollouts(canary=Target(version=2), weight=100.0, shadow=Target(version=3), share=1.0)
    for model in (ModelRef("m", 1), ModelRef("m", None, "stable"), ModelRef("plain")):
        assert routes.route(model, "caller", "id") == (model, None)
    assert routes.models["m"].counts["canary"] == 0


def test_sticky_request_id_sends_the_weight_to_the_canary_the_same_way_every_time():
    routes = rollouts(canary=Target(version=2), weight=10.0, sticky="request_id")
    ids = [f"{n:032x}" for n in range(5000)]
    first = [routes.route(ModelRef("m"), "", i)[0] for i in ids]
    again = [routes.route(ModelRef("m"), "someone else", i)[0] for i in ids]
    assert first == again
    canary = sum(model == ModelRef("m", 2) for model in first)
    assert 400 <= canary <= 600  # 10 % of 5000, give or take a hash's spread
    assert set(first) == {ModelRef("m", 2), ModelRef("m")}
    counts = routes.models["m"].counts
    assert (counts["canary"], counts["current"]) == (2 * canary, 2 * (5000 - canary))


def test_sticky_caller_keeps_each_caller_on_one_side():
    routes = rollouts(canary=Target(label="canary"), weight=50.0, sticky="caller",
                      current=Target(label="stable"))  # fmt: skip
    sides = {}
    for caller in (f"spiffe://team/{n}" for n in range(40)):
        seen = {routes.route(ModelRef("m"), caller, f"{r}")[0] for r in range(20)}
        assert len(seen) == 1
        sides[caller] = seen.pop()
    assert set(sides.values()) == {ModelRef("m", None, "canary"), ModelRef("m", None, "stable")}


def test_random_canary_weight_is_honoured_without_stickiness():
    routes = rollouts(canary=Target(version=2), weight=100.0)
    assert all(routes.route(ModelRef("m"), "", "x")[0] == ModelRef("m", 2) for _ in range(100))


def test_shadow_share_copies_requests_served_by_current_only():
    routes = rollouts(canary=Target(version=2), weight=50.0, sticky="request_id",
                      shadow=Target(version=3), share=1.0)  # fmt: skip
    rollout = routes.models["m"]
    for n in range(200):
        model, shadowed = routes.route(ModelRef("m"), "", str(n))
        assert (shadowed is rollout) == (model == ModelRef("m"))
    none = rollouts(shadow=Target(version=3), share=0.000001)
    assert sum(none.route(ModelRef("m"), "", "x")[1] is not None for _ in range(1000)) <= 1


def test_summary_counts_requests_calls_and_comparisons():
    routes = rollouts(canary=Target(version=2), weight=100.0, shadow=Target(version=3), share=1.0)
    rollout = routes.models["m"]
    routes.route(ModelRef("m"), "", "a")
    rollout.shadow_call("sent")
    rollout.shadow_call("dropped")
    rollout.record(Comparison("detection", {"precision": 0.5, "recall": 1.0}, (0.25,)))
    rollout.record(Comparison("detection", {"precision": 1.0, "recall": 0.5}, (-0.05,)))
    rollout.record(Comparison("classification", {"top1_agreement": 1.0, "topk_overlap": 0.5}))
    rollout.record(Comparison("embedding", {"cosine_similarity": 0.5}))
    rollout.record(Comparison("embedding", {"cosine_similarity": 1.0}))
    summary = rollout.summary()
    assert summary["current"] == "latest version"
    assert summary["canary"] == {"candidate": "version 2", "weight": 100.0, "sticky": "random",
                                 "served": {"canary": 1, "current": 0}}  # fmt: skip
    shadow = summary["shadow"]
    assert shadow["calls"] == {"sent": 1, "failed": 0, "dropped": 1}
    assert shadow["detection"] == {"images": 2, "precision": 0.75, "recall": 0.75,
                                   "matched_pairs": 2, "mean_score_delta": 0.1}  # fmt: skip
    assert shadow["classification"] == {"images": 1, "top1_agreement": 1.0, "topk_overlap": 0.5}
    # Any task's measures, the same way (Task.compare gives them).
    assert shadow["embedding"] == {"images": 2, "cosine_similarity": 0.75}


def test_sticky_sides_depend_on_the_deployments_secret_salt_not_only_the_request_id():
    """A caller who knows the hash cannot pick its side: the same salt gives every replica
    the same assignment, another salt (or none: a random one per process) another."""
    config = RolloutConfig(canary=Target(version=2), weight=50.0, sticky="request_id")
    models = {"m": ModelConfig("m", "detection", rollout=config)}

    def canary_ids(salt: str) -> set[str]:
        routes = Rollouts(ModelRegistry(models, "m", {}, "detection"), salt)
        return {i for i in map(str, range(400)) if routes.route(ModelRef("m"), "", i)[0].version}

    replica_a, replica_b = canary_ids("s3cret"), canary_ids("s3cret")
    assert replica_a == replica_b and 150 <= len(replica_a) <= 250
    other = canary_ids("another")
    assert 100 <= len(replica_a ^ other) <= 300  # about half the ids change side
    unsalted = {str(i) for i in range(400) if _slot_unkeyed(str(i)) < 5000}
    assert 100 <= len(replica_a ^ unsalted) <= 300 and canary_ids("") != canary_ids("")


def _slot_unkeyed(key: str) -> int:
    """What a caller could compute before the salt: the hash of the model and its id."""
    digest = hashlib.blake2b(f"m\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % 10_000
