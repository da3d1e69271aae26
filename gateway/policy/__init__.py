"""Who may do how much: each caller's quota and its fair share of the gateway
(quotas.py, fairshare.py), between the doors and the core; and which version of a model a
request gets, with copies to a shadow candidate compared in typed terms (rollout.py,
shadow.py, compare.py). `build` makes the pipeline's Policy (gateway.core.ports) from the
settings; the app hands it to the pipeline."""

from __future__ import annotations

from gateway.config import Settings
from gateway.core.ports import Policy
from gateway.models import ModelRegistry
from gateway.policy.fairshare import FairShare
from gateway.policy.rollout import Rollouts
from gateway.policy.shadow import Shadows


def build(settings: Settings, registry: ModelRegistry) -> Policy:
    """The limit with the callers' quotas (QuotaError when the file cannot be used), the
    models' rollouts and the shadow copies, which give way as the limit fills."""
    limit = FairShare.for_settings(settings)
    return Policy(
        limit=limit,
        rollouts=Rollouts(registry, settings.rollout_salt),
        shadows=Shadows(settings.max_concurrent_requests, lambda: limit.in_flight),
    )
