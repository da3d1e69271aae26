"""Which versions to serve: base-path scanning, version policies and the load/unload order.

Ports of file_system_storage_path_source.cc (numeric version directories, latest / all /
specific policies, the "No versions of servable ..." warning) and
availability_preserving_policy.cc (load the newest new version; unload an old version only
while another aspired version stays available).
"""

from __future__ import annotations

import enum
import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

from tensorflow_serving.config import model_server_config_pb2

from serving.local.errors import invalid_argument

log = logging.getLogger(__name__)

# absl::SimpleAtoi on int64: optional surrounding whitespace and sign, decimal digits.
_VERSION_RE = re.compile(r"^\s*[+-]?\d+\s*$")
_INT64_MAX = 2**63 - 1


class Harness(enum.Enum):
    """A managed version's lifecycle (LoaderHarness::State, simplified)."""

    NEW = "new"
    LOADING = "loading"
    READY = "ready"
    ERROR = "error"
    UNLOADING = "unloading"
    DISABLED = "disabled"


@dataclass(frozen=True)
class VersionSnapshot:
    """What the policy needs to know about one managed version."""

    version: int
    aspired: bool
    state: Harness


class Action(enum.Enum):
    LOAD = "load"
    UNLOAD = "unload"


def aspired_versions(model: model_server_config_pb2.ModelConfig) -> dict[int, str]:
    """Version -> directory for the versions the model's policy wants served right now.

    Raises ServingError when the base path does not exist, like TF Serving's poller.
    """
    base_path = model.base_path
    if not os.path.exists(base_path):
        raise invalid_argument(
            f"Could not find base path {base_path} for servable {model.name} with error "
            f"NOT_FOUND: {base_path} not found"
        )
    children = _children_by_version(sorted(os.listdir(base_path)))
    policy = model.model_version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        chosen = sorted(children)
    elif choice == "specific":
        chosen = _specific(model, policy.specific.versions, children)
    else:  # latest, also the default policy
        newest_first = sorted(children, reverse=True)
        chosen = newest_first[: max(policy.latest.num_versions, 1)]
    if not chosen and not (choice == "specific" and not policy.specific.versions):
        log.warning(
            "No versions of servable %s found under base path %s. Did you forget to name "
            "your leaf directory as a number (eg. '/1/')?",
            model.name,
            base_path,
        )
    return {version: os.path.join(base_path, children[version]) for version in chosen}


def next_action(versions: Iterable[VersionSnapshot]) -> tuple[Action, int] | None:
    """AvailabilityPreservingPolicy::GetNextAction."""
    snapshots = list(versions)
    has_aspired = any(s.aspired for s in snapshots)
    has_aspired_serving = any(s.aspired and s.state is Harness.READY for s in snapshots)
    unaspired_serving = [s.version for s in snapshots if not s.aspired and s.state is Harness.READY]
    if (not has_aspired or has_aspired_serving or len(unaspired_serving) > 1) and unaspired_serving:
        return Action.UNLOAD, min(unaspired_serving)
    new = [s.version for s in snapshots if s.aspired and s.state is Harness.NEW]
    if new:
        return Action.LOAD, max(new)
    return None


def _children_by_version(children: list[str]) -> dict[int, str]:
    by_version: dict[int, str] = {}
    for child in children:
        if not _VERSION_RE.match(child) or abs(int(child)) > _INT64_MAX:
            continue
        version = int(child)
        if version in by_version:
            log.warning(
                "Duplicate version directories detected. Version %d will be loaded from %s, "
                "%s will be ignored.",
                version,
                child,
                by_version[version],
            )
        by_version[version] = child
    return by_version


def _specific(
    model: model_server_config_pb2.ModelConfig,
    wanted: Iterable[int],
    children: dict[int, str],
) -> list[int]:
    wanted = sorted(set(wanted))
    if not wanted:
        log.warning("No specific versions requested for servable %s.", model.name)
    for version in wanted:
        if version not in children:
            log.warning(
                "Version %d of servable %s, which was requested to be served as a 'specific' "
                "version in the servable's version policy, was not found in the file system",
                version,
                model.name,
            )
    return [version for version in wanted if version in children]
